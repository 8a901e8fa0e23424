"""The JAX engine placed on a device mesh: tensor-parallel steps, and pushed weights moved onto it.

Runs on the 4 CPU devices of tests/conftest.py. The tiny model has 4 heads, 2 kv heads and a
vocabulary of 264, so tensor=2 shards every one of them.
"""

import jax
import numpy as np
import pytest
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from jaxrl_async.engines.base import GenerationRequest, SamplingParams, join_outputs
from jaxrl_async.engines.jax.compiles import COMPILE_COUNTS
from jaxrl_async.engines.jax.config import EngineConfig
from jaxrl_async.engines.jax.core import EngineCore
from jaxrl_async.engines.jax.layout import regroup_for
from jaxrl_async.models.config import ModelConfig
from jaxrl_async.models.transformer import Transformer
from jaxrl_async.sharding import make_mesh, shard_model
from tests.helpers.engines import assert_same_samples, mesh_of, params_of

CFG = ModelConfig.tiny()
ENGINE = dict(num_slots=4, max_len=64, min_bucket=8, decode_steps_per_call=1)  # tests count steps

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


def test_tensor_parallel_core_with_several_steps_per_call_samples_what_single_full_length_steps_sample(models):
    # min_bucket = max_len: one decode length, the whole cache: the engine before live buckets.
    want = run_across_a_swap(EngineCore(models[0], CFG, EngineConfig(**{**ENGINE, "min_bucket": 64})),
                             params_of(models[1]), swap_after=8)
    tp = EngineCore(models[0], CFG, EngineConfig(**{**ENGINE, "decode_steps_per_call": 4}),
                    mesh=mesh_of(jax.devices()[:2]))
    layout = jax.tree.map(lambda x: x.sharding, (tp.cache, tp.weights))
    got = run_across_a_swap(tp, params_of(models[1]), swap_after=2)  # 2 calls of 4 = 8 steps
    assert_same_samples(got, want)
    assert want[("greedy", 0)].versions == [[0, 8], [1, 4]]
    assert tp.counters["decode_calls"] < tp.counters["decode_steps"]
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
