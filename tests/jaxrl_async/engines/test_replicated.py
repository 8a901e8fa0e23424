"""Data-parallel replicas as one engine: least-loaded routing, abort, weight push, merged streams.

Runs on the 4 CPU devices of tests/conftest.py: one one-device `JaxEngine` per replica.
"""

import asyncio

import jax
import pytest
from flax import nnx

from jaxrl_async.engines.base import (EngineStats, GenerationEngine, GenerationRequest, SamplingParams,
                                      join_outputs, read_outputs)
from jaxrl_async.engines.jax.core import EngineConfig, EngineCore
from jaxrl_async.engines.jax.engine import JaxEngine
from jaxrl_async.engines.replicated import ReplicatedEngine
from jaxrl_async.engines.speculation import SpeculationConfig
from jaxrl_async.models.config import ModelConfig
from jaxrl_async.models.transformer import Transformer
from tests.helpers.engines import assert_same_samples, collect, mesh_of, params_of

CFG = ModelConfig.tiny()
ENGINE = dict(num_slots=4, max_len=64, min_bucket=8)


@pytest.fixture(scope="module")
def models():
    return Transformer(CFG, rngs=nnx.Rngs(0)), Transformer(CFG, rngs=nnx.Rngs(1))


def two_replicas(model) -> ReplicatedEngine:
    """Two one-device JaxEngines, on devices 0 and 1."""
    return ReplicatedEngine([JaxEngine(model, CFG, EngineConfig(**ENGINE), mesh=mesh_of([d]))
                             for d in jax.devices()[:2]])


def test_replicas_take_requests_by_fewest_live_samples_and_each_sample_matches_one_engine(models):
    group = [GenerationRequest("a", [1, 2], SamplingParams(9, seed=1, n=2)),
             GenerationRequest("b", [3], SamplingParams(9, seed=2)),
             GenerationRequest("c", [4, 5, 6], SamplingParams(9, temperature=0.0)),
             GenerationRequest("d", [7], SamplingParams(9, seed=4, top_k=5))]
    single = EngineCore(models[0], CFG, EngineConfig(**ENGINE))
    for r in group:
        single.submit(r)
    want: dict = {}
    while single.has_work():
        for out in single.step():
            want.setdefault((out.request_id, out.sample_index), []).append(out)

    async def main():
        engine = two_replicas(models[0])
        for r in group:
            await engine.submit(r)
        # Live samples at each submit: (0, 0) -> 0, (2, 0) -> 1, (2, 1) -> 1, (2, 2) tie -> 0.
        placed = {r.request_id: engine.replica_of(r.request_id) for r in group}
        with pytest.raises(ValueError, match=r"request 'a': request_id is already queued or running"):
            await engine.submit(group[0])
        queued = [(await r.stats()).queued for r in engine.replicas]
        await engine.start()
        got = await collect(engine, expect_done=5)
        await engine.update_weights(params_of(models[1]), version=3)
        stats = await engine.stats()
        versions = [(await r.stats()).version for r in engine.replicas]
        await engine.stop()
        return placed, queued, got, stats, versions

    placed, queued, got, stats, versions = asyncio.run(main())
    assert placed == {"a": 0, "b": 1, "c": 1, "d": 0}
    assert queued == [2, 2]
    assert_same_samples(got, {k: join_outputs(v) for k, v in want.items()})
    assert versions == [3, 3] and stats.version == 3
    assert stats.total_slots == 8 and stats.extra == {"replicas": 2, "per_replica_active": [0, 0]}


def test_abort_reaches_the_replica_that_holds_the_request(models):
    async def main():
        engine = two_replicas(models[0])
        await engine.submit(GenerationRequest("left", [1], SamplingParams(40, seed=1)))
        await engine.submit(GenerationRequest("right", [1], SamplingParams(40, seed=2)))
        owner = engine.replica_of("right")
        await engine.abort("right")  # before start: the replica drops it from its queue
        await engine.start()
        got = await collect(engine, expect_done=2)
        await engine.stop()
        return owner, got

    owner, got = asyncio.run(main())
    assert owner == 1
    assert got[("right", 0)].finish_reason == "abort" and got[("right", 0)].token_ids == []
    assert got[("left", 0)].finish_reason == "length" and len(got[("left", 0)].token_ids) == 40


class _StreamOnly(GenerationEngine):
    """A replica that only has an output stream: the test puts items on it."""

    def __init__(self):
        self.queue: asyncio.Queue = asyncio.Queue()

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    async def submit(self, request: GenerationRequest) -> None: ...

    async def abort(self, request_id: str) -> None: ...

    async def update_weights(self, params, version: int) -> None: ...

    def outputs(self):
        return read_outputs(self.queue)

    async def stats(self) -> EngineStats:
        return EngineStats(0, 1, 0, 0.0, 0)


def test_an_error_on_one_replica_stream_reaches_the_merged_stream():
    async def main():
        healthy, broken = _StreamOnly(), _StreamOnly()
        engine = ReplicatedEngine([healthy, broken])
        await engine.start()
        broken.queue.put_nowait(RuntimeError("replica 1 died"))
        with pytest.raises(RuntimeError, match="replica 1 died"):
            async for _ in engine.outputs():
                pass

    asyncio.run(main())


def test_mark_critical_reaches_the_owning_replica_whose_timings_count_the_drafts(models):
    spec = SpeculationConfig(when="critical", method="draft", draft_model="layers:1", tokens=3)
    requests = [GenerationRequest(rid, [1, 2, 3], SamplingParams(12, temperature=0.0)) for rid in ("a", "b")]

    async def main():
        engine = ReplicatedEngine([JaxEngine(models[0], CFG, EngineConfig(**ENGINE, speculation=spec),
                                             mesh=mesh_of([d])) for d in jax.devices()[:2]])
        for r in requests:
            await engine.submit(r)
        await engine.mark_critical("b")
        await engine.mark_critical("unknown")  # ignored
        await engine.start()
        got = await collect(engine, expect_done=2)
        await engine.stop()
        return got, engine.timings()

    got, timings = asyncio.run(main())
    drafted = {w: sum(t.drafted for t in timings if t.worker == w) for w in (0, 1)}
    assert drafted[1] > 0 and drafted[0] == 0  # "b" went to replica 1 (least loaded), "a" to 0
    assert sum(t.accepted for t in timings) <= drafted[1]
    assert got[("a", 0)].token_ids == got[("b", 0)].token_ids  # greedy: speculation changes no token
