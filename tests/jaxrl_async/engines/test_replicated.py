"""Data-parallel replicas as one engine: least-loaded routing, abort, weight push, merged streams.

Runs on the 4 CPU devices of tests/conftest.py: one one-device `JaxEngine` per replica.
"""

import asyncio

import jax
import pytest
from flax import nnx

from jaxrl_async.engines.base import (EngineStats, GenerationEngine, GenerationRequest, SampleOutput,
                                      SamplingParams, join_outputs, read_outputs)
from jaxrl_async.engines.jax.config import EngineConfig
from jaxrl_async.engines.jax.core import EngineCore
from jaxrl_async.engines.jax.engine import JaxEngine
from jaxrl_async.engines.migration import MovedRequest, MovedSample
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



async def _read_until(engine, pieces: dict, keys: set) -> None:
    """Read the merged stream into `pieces` until every (request, sample) of `keys` is done."""
    keys = {k for k in keys if not any(p.done for p in pieces.get(k, ()))}
    if not keys:
        return
    async for out in engine.outputs():
        pieces.setdefault((out.request_id, out.sample_index), []).append(out)
        if out.done:
            keys.discard((out.request_id, out.sample_index))
        if not keys:
            return


LONG = GenerationRequest("long", [3, 1, 4], SamplingParams(40, temperature=1.0, top_p=0.9, seed=5))
SIDE = GenerationRequest("side", [2], SamplingParams(30, seed=6, n=2))
GONE = GenerationRequest("gone", [1], SamplingParams(30, seed=7, n=2))


async def _skewed(model) -> tuple[ReplicatedEngine, dict, dict]:
    """Two started replicas, 0 crowded and 1 idle: 0 holds "long" (n=1) and "side" (n=2); 1's
    "gone" (n=2) is aborted before the start and its aborts are read: [3, 0] live samples."""
    engine = two_replicas(model)
    for r in (LONG, GONE, SIDE):
        await engine.submit(r)
    placed = {r.request_id: engine.replica_of(r.request_id) for r in (LONG, GONE, SIDE)}
    await engine.abort("gone")
    await engine.start()
    pieces: dict = {}
    await _read_until(engine, pieces, {("gone", 0), ("gone", 1)})
    return engine, placed, pieces


def test_migrate_moves_a_straggler_to_the_idle_replica_and_it_samples_what_one_engine_samples(models):
    single = EngineCore(models[0], CFG, EngineConfig(**ENGINE))
    for r in (LONG, SIDE):
        single.submit(r)
    want: dict = {}
    while single.has_work():
        for out in single.step():
            want.setdefault((out.request_id, out.sample_index), []).append(out)

    async def main():
        engine, placed, pieces = await _skewed(models[0])
        moved = await engine.migrate("long")  # 3 - 1 = 2 live samples stay on 0; 1 has none
        owner = engine.replica_of("long")
        # Now [2, 1]: neither move would leave its source more loaded than the target.
        refused = [await engine.migrate("side"), await engine.migrate("long"), await engine.migrate("unknown")]
        await _read_until(engine, pieces, {("long", 0), ("side", 0), ("side", 1)})
        counters = [(await r.stats()).extra["counters"] for r in engine.replicas]
        await engine.stop()
        return placed, moved, owner, refused, pieces, counters

    placed, moved, owner, refused, pieces, counters = asyncio.run(main())
    assert placed == {"long": 0, "gone": 1, "side": 0}
    assert moved == (0, 1) and owner == 1 and refused == [None, None, None]
    assert counters[0]["migrated_out"] == 1 and counters[1]["migrated_in"] == 1
    for key, p in pieces.items():
        assert sum(x.done for x in p) == 1 and p[-1].done, key
    got = {k: join_outputs(v) for k, v in pieces.items() if k[0] != "gone"}
    assert_same_samples(got, {k: join_outputs(v) for k, v in want.items()})


def test_an_abort_during_a_migration_reaches_the_target_and_ends_the_sample_once(models):
    async def main():
        engine, _, pieces = await _skewed(models[0])
        moved, _ = await asyncio.gather(engine.migrate("long"), engine.abort("long"))
        await _read_until(engine, pieces, {("long", 0), ("side", 0), ("side", 1)})
        await engine.abort("long")  # finished: ignored
        await engine.stop()
        return moved, pieces

    moved, pieces = asyncio.run(main())
    assert moved == (0, 1)
    assert sum(p.done for p in pieces[("long", 0)]) == 1
    assert join_outputs(pieces[("long", 0)]).finish_reason == "abort"


class _GatedReplica(_StreamOnly):
    """A migratable replica whose weight push and detach wait for the test's gates."""

    def __init__(self):
        super().__init__()
        self.push_gate, self.detach_gate = asyncio.Event(), asyncio.Event()
        self.attached: list = []

    async def update_weights(self, params, version: int) -> None:
        await self.push_gate.wait()

    async def detach(self, request_id: str):
        await self.detach_gate.wait()
        return MovedRequest(GenerationRequest(request_id, [1], SamplingParams(8)), (MovedSample(0, (5, 6)),))

    async def attach(self, moved) -> None:
        self.attached.append(moved)


def test_a_move_and_a_weight_push_exclude_each_other_so_a_samples_versions_never_go_down():
    async def main():
        replicas = [_GatedReplica(), _GatedReplica()]
        engine = ReplicatedEngine(replicas)
        await engine.start()
        for rid in ("a", "b", "c"):  # a -> 0, b -> 1, c -> 0 (a tie goes to the lowest index)
            await engine.submit(GenerationRequest(rid, [1], SamplingParams(8)))
        replicas[1].queue.put_nowait(SampleOutput("b", 0, [], [], [], "stop", True))
        while engine.replica_of("b") is not None:
            await asyncio.sleep(0)  # live samples [2, 0]: moving "a" would leave 1 on replica 0
        push = asyncio.ensure_future(engine.update_weights({}, version=1))
        await asyncio.sleep(0)
        during_push = await engine.migrate("a")
        for r in replicas:
            r.push_gate.set()
        await push
        move = asyncio.ensure_future(engine.migrate("a"))
        await asyncio.sleep(0)  # the move waits for the source's detach
        push = asyncio.ensure_future(engine.update_weights({}, version=2))
        for _ in range(3):
            await asyncio.sleep(0)
        push_waited = not push.done()
        replicas[0].detach_gate.set()
        moved = await move
        await push
        return during_push, push_waited, moved, replicas[1].attached

    during_push, push_waited, moved, attached = asyncio.run(main())
    assert during_push is None and push_waited and moved == (0, 1)  # the same move, once no push runs
    assert [m.request_id for m in attached] == ["a"]


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


def test_replicas_adapter_versions_are_summed_and_their_resident_versions_joined():
    from jaxrl_async.engines.replicated import adapter_totals

    one = {"versions": 3, "resident": [3, 4, 5], "pushes_pinned": 5, "pushes_waited": 1}
    two = {"versions": 3, "resident": [2, 4, 5], "pushes_pinned": 5, "pushes_waited": 0}
    assert adapter_totals([one, two]) == {"adapters": {"versions": 3, "resident": [2, 3, 4, 5], "pushes_pinned": 10,
                                                       "pushes_waited": 1}}
    assert adapter_totals([None, None]) == {}
