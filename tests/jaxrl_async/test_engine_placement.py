"""The JAX engine placed on devices: tensor-parallel over a mesh, and data-parallel replicas.

Runs on the 4 CPU devices of tests/conftest.py. The tiny model has 4 heads, 2 kv heads and a
vocabulary of 264, so tensor=2 shards every one of them.
"""

import asyncio

import jax
import numpy as np
import pytest
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from jaxrl_async.engines.base import (EngineStats, GenerationEngine, GenerationRequest, SamplingParams,
                                      join_outputs, read_outputs)
from jaxrl_async.engines.jax.core import COMPILE_COUNTS, EngineConfig, EngineCore
from jaxrl_async.engines.jax.layout import regroup_for
from jaxrl_async.engines.jax.engine import JaxEngine
from jaxrl_async.engines.replicated import ReplicatedEngine
from jaxrl_async.models.config import ModelConfig
from jaxrl_async.models.transformer import Transformer
from jaxrl_async.sharding import make_mesh, shard_model
from tests.helpers.engines import assert_same_samples, collect, mesh_of, params_of

CFG = ModelConfig.tiny()
ENGINE = dict(num_slots=4, max_len=64, min_bucket=8)

COMPILED: list[str] = []  # every backend compilation in this process, by function name
jax.monitoring.register_event_duration_secs_listener(
    lambda event, duration, **kw: COMPILED.append(kw.get("fun_name", ""))
    if event == "/jax/core/compile/backend_compile_duration" else None)


@pytest.fixture(scope="module")
def models():
    return Transformer(CFG, rngs=nnx.Rngs(0)), Transformer(CFG, rngs=nnx.Rngs(1))


def requests() -> list[GenerationRequest]:
    return [GenerationRequest("greedy", [1, 2, 3], SamplingParams(12, temperature=0.0)),
            GenerationRequest("group", [4, 5], SamplingParams(12, seed=3, n=2)),
            GenerationRequest("nucleus", list(range(9)), SamplingParams(10, seed=4, top_p=0.9, top_k=20))]


def run_across_a_swap(core: EngineCore, new_params, swap_after: int = 4, version: int = 1) -> dict:
    """Submit `requests()`, push `new_params` after `swap_after` steps, run to the end."""
    for r in requests():
        core.submit(r)
    pieces: dict = {}
    step = 0
    while core.has_work():
        if step == swap_after:
            core.update_weights(new_params, version)
        for out in core.step():
            pieces.setdefault((out.request_id, out.sample_index), []).append(out)
        step += 1
    return {key: join_outputs(p) for key, p in pieces.items()}


def test_engine_config_rejects_bad_placement_fields_naming_them():
    with pytest.raises(ValueError, match=r"EngineConfig.replicas=0: must be an int >= 1"):
        EngineConfig(replicas=0)
    with pytest.raises(ValueError, match=r"EngineConfig.tensor_parallel=1.5: must be an int >= 1"):
        EngineConfig(tensor_parallel=1.5)
    with pytest.raises(ValueError, match=r"EngineConfig.colocate='yes': must be true or false"):
        EngineConfig(colocate="yes")


def test_tensor_parallel_core_samples_what_one_device_samples_greedy_and_seeded_across_a_weight_swap(models):
    single = EngineCore(models[0], CFG, EngineConfig(**ENGINE))
    tp = EngineCore(models[0], CFG, EngineConfig(**ENGINE), mesh=mesh_of(jax.devices()[:2]))
    # The table's layouts: kv heads, heads and the MLP hidden dim on `tensor`.
    assert tp.cache.k[0].sharding.spec == P(("data", "fsdp"), "tensor", None, None)
    assert tp.weights["layers"][0]["wq"].sharding.spec == P("fsdp", "tensor", None)
    assert tp.weights["layers"][1]["w_down"].sharding.spec == P("tensor", "fsdp")
    layout = jax.tree.map(lambda x: x.sharding, (tp.cache, tp.weights))
    want = run_across_a_swap(single, params_of(models[1]))
    got = run_across_a_swap(tp, params_of(models[1]))
    assert_same_samples(got, want)
    assert want[("greedy", 0)].versions == [[0, 4], [1, 8]]  # the swap lands mid-sample
    assert len(set(map(tuple, (want[k].token_ids for k in want)))) == 4  # greedy and 3 seeded
    # Prefill, prefix copy, swap and decode hand back exactly the layouts they were given.
    assert jax.tree.map(lambda x: x.sharding, (tp.cache, tp.weights)) == layout


def test_weights_from_a_differently_sharded_trainer_move_onto_the_engine_devices_without_recompiling(models):
    trainer_params = shard_model(nnx.state(models[1], nnx.Param), make_mesh(fsdp=2, tensor=2))
    wq = nnx.to_pure_dict(trainer_params)["layers"]["wq"]
    assert wq.sharding.spec[1:3] == ("fsdp", "tensor") and len(wq.devices()) == 4
    engine_devices = set(jax.devices()[2:4])
    core = EngineCore(models[0], CFG, EngineConfig(**ENGINE), mesh=mesh_of(jax.devices()[2:4]))
    want = run_across_a_swap(EngineCore(models[0], CFG, EngineConfig(**ENGINE)), params_of(models[1]))
    assert_same_samples(run_across_a_swap(core, trainer_params), want)
    for leaf in jax.tree.leaves(core.weights):
        assert leaf.devices() == engine_devices
    before, compiled = dict(COMPILE_COUNTS), len(COMPILED)
    core.update_weights(trainer_params, version=2)
    run_across_a_swap(core, trainer_params, version=3)  # the same prompt buckets as the first run
    assert dict(COMPILE_COUNTS) == before
    assert COMPILED[compiled:] == []  # nor the regroup, the install or anything else


def test_regroup_puts_each_engine_block_on_a_trainer_device_so_the_move_copies_device_buffers():
    trainer = jax.device_put(np.arange(64.0).reshape(8, 8),
                             NamedSharding(make_mesh(fsdp=2, tensor=2), P("fsdp", "tensor")))
    target = NamedSharding(mesh_of(jax.devices()[2:4]), P(None, "tensor"))
    regrouped = regroup_for(trainer, target)
    assert regrouped.devices() == trainer.devices()
    held = [shard.index for shard in regrouped.addressable_shards]
    assert all(block in held for block in target.devices_indices_map((8, 8)).values())
    np.testing.assert_array_equal(jax.device_put(regrouped, target), np.arange(64.0).reshape(8, 8))


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
