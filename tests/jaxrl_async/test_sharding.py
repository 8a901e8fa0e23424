"""Shardings derived from the parameters' logical axes; sharded forward == unsharded forward."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import PartitionSpec as P

from jaxrl_async.engines.jax.steps import engine_decode, engine_prefill
from jaxrl_async.models import ModelConfig, Transformer, init_cache
from jaxrl_async.models.transformer import inference_weights
from jaxrl_async.sharding import (batch_sharding, cache_shardings, logical_to_spec, make_mesh,
                                  param_shardings, shard_model)


@pytest.fixture(scope="module")
def tiny():
    cfg = ModelConfig.tiny()
    graphdef, state = nnx.split(Transformer(cfg, rngs=nnx.Rngs(0)))
    tokens = jnp.asarray(np.random.RandomState(0).randint(0, cfg.vocab_size, (4, 8)), jnp.int32)
    positions = jnp.broadcast_to(jnp.arange(8), (4, 8))
    return cfg, graphdef, state, tokens, positions


@pytest.mark.parametrize("shape", [{"fsdp": 2, "tensor": 2}, {"data": 4}])
def test_sharded_forward_equals_the_unsharded_one(tiny, shape):
    cfg, graphdef, state, tokens, positions = tiny
    fwd = jax.jit(lambda state, tokens, positions: nnx.merge(graphdef, state)(tokens, positions))
    ref = fwd(state, tokens, positions)
    mesh = make_mesh(**shape)
    sharded = shard_model(state, mesh)
    out = fwd(sharded, jax.device_put(tokens, batch_sharding(mesh)),
              jax.device_put(positions, batch_sharding(mesh)))
    np.testing.assert_allclose(out, ref, atol=1e-5)
    if shape.get("tensor"):
        assert sharded["layers"]["wq"].get_value().sharding.spec == P(None, "fsdp", "tensor", None)
        assert sharded["embed"].get_value().sharding.spec == P("tensor", "fsdp")


@pytest.mark.parametrize("shape", [{"fsdp": 2, "tensor": 2}, {"data": 4}])
def test_sharded_engine_prefill_and_decode_equal_the_unsharded_ones(tiny, shape):
    """The generation forward over sharded per-layer weights and a sharded per-layer cache."""
    cfg, _, state, tokens, positions = tiny
    weights = jax.jit(inference_weights)(nnx.to_pure_dict(state))

    @jax.jit
    def prefill_then_decode(weights, cache):
        zeros = jnp.zeros((4,), jnp.int32)
        cache = engine_prefill(cfg, weights, cache, tokens.reshape(1, -1), positions.reshape(1, -1),
                               jnp.repeat(jnp.arange(4), 8)[None], jnp.repeat(jnp.arange(4), 8))
        return engine_decode(cfg, weights, cache, tokens[:, 0], zeros + 8, zeros.astype(jnp.uint32),
                             zeros, zeros, zeros.astype(jnp.float32), zeros + 1.0, zeros)

    ref_cache, ref_tokens, ref_logprobs = prefill_then_decode(weights, init_cache(cfg, 4, 16))
    mesh = make_mesh(**shape)
    sharded = jax.jit(inference_weights)(nnx.to_pure_dict(shard_model(state, mesh)))
    cache = init_cache(cfg, 4, 16)
    cache, next_tokens, logprobs = prefill_then_decode(sharded, jax.device_put(cache, cache_shardings(cache, mesh)))
    np.testing.assert_allclose(logprobs, ref_logprobs, atol=1e-5)
    np.testing.assert_array_equal(next_tokens, ref_tokens)
    np.testing.assert_allclose(cache.k[1], ref_cache.k[1], atol=1e-5)
    if shape.get("tensor"):
        assert sharded["layers"][0]["wq"].sharding.spec == P("fsdp", "tensor")
        assert cache.v[0].sharding.spec == P("fsdp", "tensor")  # data=1 drops out


def test_shard_model_places_a_module_in_place_and_param_shardings_keeps_the_tree():
    cfg = ModelConfig.tiny(num_kv_heads=1)
    model = Transformer(cfg, rngs=nnx.Rngs(0))
    mesh = make_mesh(fsdp=2, tensor=2)
    shardings = param_shardings(nnx.state(model), mesh)
    assert jax.tree.structure(shardings) == jax.tree.structure(nnx.state(model))
    # one KV head cannot be split over tensor=2: replicated rather than rejected
    assert shardings["layers"]["wk"].get_value().spec == P(None, "fsdp", None, None)
    assert shard_model(model, mesh) is model
    assert model.layers.w_up.get_value().sharding.spec == P(None, "fsdp", "tensor")


def test_two_logical_axes_on_one_mesh_axis_are_refused():
    mesh = make_mesh(fsdp=2, tensor=2)
    rules = {"vocab": "tensor", "embed": "tensor"}
    with pytest.raises(ValueError, match="'vocab' and 'embed' .* both map to mesh axis 'tensor'"):
        logical_to_spec(("vocab", "embed"), (8, 8), mesh, rules)
    with pytest.raises(ValueError, match="logical axis 'rows' has no sharding rule"):
        logical_to_spec(("rows",), (8,), mesh)


def test_make_mesh_checks_the_device_count():
    assert make_mesh(data=2, tensor=2).shape == {"data": 2, "fsdp": 1, "tensor": 2}
    with pytest.raises(ValueError, match="needs 8 devices, 4 available"):
        make_mesh(data=2, fsdp=2, tensor=2)
    with pytest.raises(ValueError, match="make_mesh fsdp=0"):
        make_mesh(fsdp=0)
