"""JaxEngine: the core driven from a worker thread, seen from asyncio."""

import asyncio

import jax.numpy as jnp
import pytest
from flax import nnx

from jaxrl_async.engines.base import GenerationRequest, SamplingParams, join_outputs
from jaxrl_async.engines.jax.config import EngineConfig
from jaxrl_async.engines.jax.core import EngineCore
from jaxrl_async.engines.jax.engine import JaxEngine, make_core
from jaxrl_async.engines.jax.paged import PagedEngineCore
from jaxrl_async.engines.speculation import SpeculationConfig
from jaxrl_async.models.config import ModelConfig
from jaxrl_async.models.transformer import Transformer
from tests.helpers.engines import collect

CFG = ModelConfig.tiny()
ENGINE = dict(num_slots=4, max_len=64, min_bucket=8)


@pytest.fixture(scope="module")
def models():
    return Transformer(CFG, rngs=nnx.Rngs(0)), Transformer(CFG, rngs=nnx.Rngs(1))


def requests() -> list[GenerationRequest]:
    return [GenerationRequest("greedy", [1, 2, 3], SamplingParams(9, temperature=0.0)),
            GenerationRequest("group", [4, 5], SamplingParams(7, seed=3, n=3), priority=1.0),
            GenerationRequest("late", list(range(20)), SamplingParams(5, seed=4, top_k=4))]


def run_synchronously(core) -> dict:
    """`requests()` through `core` alone: (request id, sample index) -> its output."""
    for r in requests():
        core.submit(r)
    want = {}
    while core.has_work():
        for out in core.step():
            want[(out.request_id, out.sample_index)] = out
    return want


def test_async_engine_streams_the_same_samples_as_the_synchronous_core(models):
    want = run_synchronously(EngineCore(models[0], CFG, EngineConfig(**ENGINE)))

    async def main():
        engine = JaxEngine(models[0], CFG, EngineConfig(**ENGINE, stream_every=2))
        await engine.start()
        for r in requests():
            await engine.submit(r)
        got = await collect(engine, expect_done=5)
        stats = await engine.stats()
        await engine.stop()
        assert [o async for o in engine.outputs()] == []  # the stream ends after stop
        return got, stats

    got, stats = asyncio.run(main())
    assert got == want
    assert (stats.active_slots, stats.queued, stats.total_slots, stats.version) == (0, 0, 4, 0)
    assert 0 < stats.busy_fraction <= 1
    assert stats.extra["counters"]["tokens"] == sum(len(o.token_ids) for o in want.values())


def test_a_paged_engine_config_runs_the_paged_core_in_the_worker_thread(models):
    config = EngineConfig(**ENGINE, page_size=8, kv_pages=8)
    core = make_core(models[0], CFG, config)
    want = run_synchronously(core)

    async def main():
        engine = JaxEngine(models[0], CFG, config)
        assert isinstance(engine.core, PagedEngineCore)
        await engine.start()
        for r in requests():
            await engine.submit(r)
        got = await collect(engine, expect_done=5)
        await engine.stop()
        return got

    assert asyncio.run(main()) == want
    assert core.pages.pool.free == 8


def test_update_weights_returns_once_the_new_version_is_in_use(models):
    new_params = nnx.split(models[1], nnx.Param, ...)[1]

    async def main():
        engine = JaxEngine(models[0], CFG, EngineConfig(**ENGINE, stream_every=1))
        await engine.start()
        await engine.submit(GenerationRequest("long", [1, 2], SamplingParams(60, temperature=0.0)))
        stream = engine.outputs()
        pieces = [await anext(stream)]  # "long" is decoding
        await engine.update_weights(new_params, version=3)
        assert (await engine.stats()).version == 3
        await engine.submit(GenerationRequest("after", [1, 2], SamplingParams(5, temperature=0.0)))
        async for out in stream:
            pieces.append(out)
            if sum(p.done for p in pieces) == 2:
                break
        await engine.stop()
        return (join_outputs(p for p in pieces if p.request_id == name) for name in ("long", "after"))

    long, after = asyncio.run(main())
    # The exact split point is the core tests' business; here: the in-flight sample was not
    # dropped, and everything submitted after the await ran on the new weights.
    assert long.versions[0][0] == 0 and {v for v, _ in long.versions} <= {0, 3}
    assert len(long.token_ids) == 60 and long.finish_reason == "length"
    assert after.versions == [[3, 5]]


def test_drain_mode_update_waits_for_in_flight_samples_to_finish(models):
    new_params = nnx.split(models[1], nnx.Param, ...)[1]

    async def main():
        engine = JaxEngine(models[0], CFG, EngineConfig(**ENGINE, sync_mode="drain", stream_every=1))
        await engine.start()
        await engine.submit(GenerationRequest("old", [1, 2], SamplingParams(30, temperature=0.0)))
        stream = engine.outputs()
        pieces = [await anext(stream)]  # "old" is in flight
        update = asyncio.create_task(engine.update_weights(new_params, version=1))
        await asyncio.sleep(0)  # the update's command is sent before the next submit
        await engine.submit(GenerationRequest("new", [1, 2], SamplingParams(5, temperature=0.0)))
        async for out in stream:
            pieces.append(out)
            if out.done and out.request_id == "old":
                break
        await update
        async for out in stream:
            pieces.append(out)
            if out.done:
                break
        await engine.stop()
        return [join_outputs(p for p in pieces if p.request_id == name) for name in ("old", "new")]

    old, new = asyncio.run(main())
    assert (old.request_id, old.versions) == ("old", [[0, 30]])
    assert (new.request_id, new.versions) == ("new", [[1, 5]])


def test_submit_and_update_errors_surface_in_the_caller_and_an_abort_still_ends_the_request(models):
    async def main():
        engine = JaxEngine(models[0], CFG, EngineConfig(**ENGINE))
        # Not started yet, so that "ok" is still queued when the abort arrives (deterministic).
        with pytest.raises(ValueError, match="request 'long': prompt of 60 tokens"):
            await engine.submit(GenerationRequest("long", [1] * 60, SamplingParams(5)))
        await engine.submit(GenerationRequest("ok", [1], SamplingParams(50, n=2)))
        with pytest.raises(ValueError, match="request 'ok': request_id is already queued"):
            await engine.submit(GenerationRequest("ok", [1], SamplingParams(5)))
        bad = nnx.to_pure_dict(nnx.split(models[1], nnx.Param, ...)[1])
        bad["embed"] = jnp.zeros((2, 2))
        with pytest.raises(ValueError, match=r"^params/embed is float32\[2, 2\] in the pushed weights"):
            await engine.update_weights(bad, version=1)
        await engine.abort("ok")
        await engine.abort("never-submitted")
        await engine.start()
        stream = engine.outputs()
        outs = [await anext(stream), await anext(stream)]
        await engine.submit(GenerationRequest("ok", [1], SamplingParams(3)))  # the id is free again
        outs.append(await anext(stream))
        await engine.stop()
        return outs

    aborted_0, aborted_1, again = asyncio.run(main())
    for i, out in enumerate([aborted_0, aborted_1]):
        assert (out.request_id, out.sample_index, out.token_ids, out.finish_reason, out.done) == (
            "ok", i, [], "abort", True)
    assert (again.request_id, again.finish_reason, len(again.token_ids)) == ("ok", "length", 3)


def test_stop_fails_a_pending_weight_update_instead_of_leaving_it_hanging(models):
    new_params = nnx.split(models[1], nnx.Param, ...)[1]

    async def main():
        engine = JaxEngine(models[0], CFG, EngineConfig(**ENGINE))  # never started: never swaps
        update = asyncio.create_task(engine.update_weights(new_params, version=1))
        await asyncio.sleep(0)
        await engine.stop()
        with pytest.raises(RuntimeError, match="stopped before the new weights were in use"):
            await update

    asyncio.run(main())


def test_a_detach_the_worker_never_answers_fails_instead_of_hanging_the_migration(models):
    async def main():
        engine = JaxEngine(models[0], CFG, EngineConfig(**ENGINE))  # never started: never answers
        await engine.submit(GenerationRequest("r", [1, 2], SamplingParams(4)))
        detach = asyncio.create_task(engine.detach("r"))
        await asyncio.sleep(0)
        assert not detach.done()  # it really waits on the worker
        engine._fail(RuntimeError("worker died"))  # what the worker thread hands the loop when it dies
        with pytest.raises(RuntimeError, match="worker died"):
            await asyncio.wait_for(detach, 5)  # a hang is a TimeoutError: red

    asyncio.run(main())


def test_each_iterations_timing_says_how_many_samples_drafted_and_what_they_drafted(models):
    # The self-draft always drafts k tokens for a sample with two or more tokens to go.
    spec = SpeculationConfig(when="always", method="draft", draft_model="layers:1", tokens=2)

    async def main():
        engine = JaxEngine(models[0], CFG, EngineConfig(**ENGINE, decode_steps_per_call=1, speculation=spec))
        await engine.start()
        for r in requests():
            await engine.submit(r)
        await collect(engine, expect_done=5)
        await engine.stop()
        return engine.timings(), engine.core.counters

    timings, counters = asyncio.run(main())
    decode = [t for t in timings if t.kind == "decode"]
    assert counters["speculating"] > 0
    assert sum(t.speculating for t in decode) == counters["speculating"]
    assert sum(t.drafted for t in decode) == counters["drafted"] and sum(t.accepted for t in decode) == counters["accepted"]
    assert all(t.drafted <= 2 * t.speculating for t in decode)  # k = 2 per drafting sample and pass
