"""`EngineClient` (jaxrl_async/serving/client.py): concurrent callers over one real engine each get
their own samples, a cancelled caller aborts its request, a refused or a failed one says so."""

from __future__ import annotations

import asyncio

import pytest

from jaxrl_async.engines.base import SamplingParams
from jaxrl_async.engines.jax.engine import JaxEngine
from jaxrl_async.serving.client import EngineClient, EngineStopped
from tests.helpers.serving import ENGINE, DyingEngine, HoldingEngine, run_directly, tiny

LOADED = tiny()


def engine() -> JaxEngine:
    return JaxEngine(LOADED.model, LOADED.cfg, ENGINE)


def test_concurrent_callers_each_get_their_own_samples_equal_to_the_engines_direct_answer():
    requests = [([3, 4, 5], SamplingParams(max_new_tokens=7, temperature=1.0, seed=1, n=2)),
                ([9, 8], SamplingParams(max_new_tokens=5, temperature=0.0)),
                ([3, 4, 5], SamplingParams(max_new_tokens=6, temperature=1.0, seed=2))]

    async def go():
        client = EngineClient(engine())
        await client.start()
        got = await asyncio.gather(*(client.generate(p, s) for p, s in requests))
        await client.stop()
        return client, got

    client, got = asyncio.run(go())
    for (prompt, sampling), samples in zip(requests, got):
        want = run_directly(LOADED, prompt, sampling)
        assert [s.token_ids for s in samples] == [w.token_ids for w in want]
        assert [s.versions for s in samples] == [w.versions for w in want]
    assert sorted({s.request_id for samples in got for s in samples}) == ["serve-0", "serve-1", "serve-2"]
    assert client.summary() == {"submitted": 3, "finished": 3, "aborted": 0, "refused": 0, "failed": 0, "in_flight": 0}


def test_a_cancelled_caller_aborts_its_request_and_the_others_go_on():
    async def go():
        held = HoldingEngine(engine())
        client = EngineClient(held)
        await client.start()
        task = asyncio.create_task(client.generate([1, 2], SamplingParams(max_new_tokens=8)))
        while client.counts["submitted"] < 1:
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await client.stop()
        return held, client

    held, client = asyncio.run(go())
    assert held.aborted == ["serve-0"] and client.counts["aborted"] == 1 and client.in_flight == 0


def test_a_request_the_engine_refuses_is_its_one_line_and_counted():
    async def go():
        client = EngineClient(engine())
        await client.start()
        with pytest.raises(ValueError, match="exceeds engine.max_len=64"):
            await client.generate([1] * 60, SamplingParams(max_new_tokens=10))
        await client.stop()
        return client

    client = asyncio.run(go())
    assert client.summary() == {"submitted": 0, "finished": 0, "aborted": 0, "refused": 1, "failed": 0, "in_flight": 0}


def test_a_dead_engine_fails_the_waiting_caller_and_every_later_one():
    async def go():
        client = EngineClient(DyingEngine(engine()))
        await client.start()
        with pytest.raises(EngineStopped, match="the engine died: device lost"):
            await client.generate([1, 2], SamplingParams(max_new_tokens=4))
        with pytest.raises(EngineStopped, match="device lost"):
            await client.generate([1, 2], SamplingParams(max_new_tokens=4))
        await client.stop()
        return client

    client = asyncio.run(go())
    assert client.counts["failed"] == 1 and str(client.error) == "device lost"
