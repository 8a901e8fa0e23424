"""EngineCore given LoRA adapters (a push of the adapter alone, merged on the engine side): the
tokens it samples are a merged model's, each push merges into the base (not into the previous
merge), and an adapter that does not fit is refused naming the weight."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxrl_async.engines.base import GenerationRequest, SamplingParams
from jaxrl_async.models.lora import LoraAdapter, init_adapter, merged_params, tree_nbytes
from tests.jaxrl_async.engines.jax.test_core import make_core, peaked_model, run

TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@pytest.fixture(scope="module")
def model():
    return peaked_model()


def trained_adapter(model, seed: int, rank: int = 4) -> LoraAdapter:
    """An adapter as after training: A and B both nonzero (a fresh one has B = 0)."""
    shapes = {k: v.shape for k, v in nnx.to_pure_dict(nnx.state(model, nnx.Param))["layers"].items()}
    params = init_adapter(shapes, rank, TARGETS, jax.random.key(seed))
    keys = iter(jax.random.split(jax.random.key(seed + 100), 16))
    params = jax.tree.map(lambda x: x + 0.05 * jax.random.normal(next(keys), x.shape), params)
    return LoraAdapter(params, 2.0)


def merged_model(model, adapter: LoraAdapter):
    graphdef, state = nnx.split(model, nnx.Param)
    return nnx.merge(graphdef, merged_params(nnx.to_pure_dict(state), adapter))


def sample(core) -> dict:
    core.submit(GenerationRequest("a", [1, 2, 3], SamplingParams(12, temperature=0.8, seed=3, n=2)))
    core.submit(GenerationRequest("b", [9], SamplingParams(12, temperature=1.0, top_p=0.9, seed=4)))
    return run(core)


def test_the_engine_samples_what_the_merged_model_samples(model):
    first, second = trained_adapter(model, 1), trained_adapter(model, 2)
    core = make_core(model)
    core.update_weights(first, version=1)
    got = sample(core)
    want = sample(make_core(merged_model(model, first)))
    assert {k: v.token_ids for k, v in got.items()} == {k: v.token_ids for k, v in want.items()}
    for key in got:
        np.testing.assert_allclose(got[key].logprobs, want[key].logprobs, atol=1e-4)
        assert got[key].versions[0][0] == 1
    unadapted = sample(make_core(model))
    assert {k: v.token_ids for k, v in got.items()} != {k: v.token_ids for k, v in unadapted.items()}
    # The second push merges into the base, not into the first merge.
    core.update_weights(second, version=2)
    got = sample(core)
    want = sample(make_core(merged_model(model, second)))
    assert {k: v.token_ids for k, v in got.items()} == {k: v.token_ids for k, v in want.items()}


def test_an_adapter_push_moves_a_small_fraction_of_the_weights(model):
    adapter = trained_adapter(model, 1)
    full = nnx.to_pure_dict(nnx.state(model, nnx.Param))
    assert tree_nbytes(adapter) < 0.2 * tree_nbytes(full)


def test_an_adapter_that_does_not_fit_is_refused_naming_the_weight(model):
    adapter = trained_adapter(model, 1)
    layers = dict(adapter.params["layers"])
    layers["wq"] = {"a": layers["wq"]["a"], "b": jnp.zeros((2, 4, 5, 16))}
    core = make_core(model)
    with pytest.raises(ValueError, match=r"^the pushed adapter: layers/wq A \[2, 64, 4\] and B \[2, 4, 5, 16\]"):
        core.update_weights(LoraAdapter({"layers": layers}, 2.0), version=1)
    with pytest.raises(ValueError, match=r"^the pushed adapter: layers/w_in is not an adaptable weight"):
        core.update_weights(LoraAdapter({"layers": {"w_in": layers["wq"]}}, 2.0), version=1)


def test_an_adapter_after_full_weights_is_refused(model):
    core = make_core(model)
    core.update_weights(nnx.state(peaked_model(seed=1), nnx.Param), version=1)
    with pytest.raises(ValueError, match="a LoRA adapter after full weights"):
        core.update_weights(trained_adapter(model, 1), version=2)
