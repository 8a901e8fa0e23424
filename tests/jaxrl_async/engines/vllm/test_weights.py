"""The vLLM weight push's checks (`WeightChecker`): JAX params, then HF tensors. No vLLM needed."""

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxrl_async.engines.vllm.weights import WeightChecker
from jaxrl_async.models.config import ModelConfig
from jaxrl_async.models.loading import build_model
from jaxrl_async.trees import TreeMismatch

CFG = ModelConfig.tiny()


@pytest.fixture(scope="module")
def checker():
    return WeightChecker(build_model(CFG), CFG)


def params(seed: int = 1) -> dict:
    return nnx.to_pure_dict(nnx.state(build_model(CFG, seed=seed), nnx.Param))


def test_matching_params_become_the_hf_tensors_of_the_engine(checker):
    tensors = checker.to_hf(params())
    assert set(tensors) == set(checker.hf_spec) and "model.embed_tokens.weight" in tensors
    assert tensors["model.embed_tokens.weight"].shape == (CFG.vocab_size, CFG.hidden_size)


def test_a_param_of_the_wrong_shape_is_named_before_anything_is_converted(checker):
    bad = params()
    bad["layers"]["wq"] = jnp.zeros((1, 2, 3))
    with pytest.raises(TreeMismatch, match=r"^params/layers/wq is float32\[1, 2, 3\] in the pushed weights; "
                                           r"expected float32\[2, "):
        checker.to_hf(bad)


def test_a_missing_param_is_named(checker):
    bad = params()
    del bad["final_norm"]
    with pytest.raises(TreeMismatch, match=r"^params/final_norm \(float32\[64\]\) is missing from the pushed weights$"):
        checker.to_hf(bad)


def test_hf_tensors_are_checked_by_name_shape_and_dtype(checker):
    tensors = checker.to_hf(params())
    checker.check_hf(tensors)
    name = "model.norm.weight"
    with pytest.raises(TreeMismatch, match=rf"^{name} is bfloat16\[64\] in the HF tensors for vLLM; expected float32\[64\]$"):
        checker.check_hf({**tensors, name: tensors[name].astype(jnp.bfloat16)})
    with pytest.raises(TreeMismatch, match=rf"^{name} \(float32\[64\]\) is missing from the HF tensors for vLLM$"):
        checker.check_hf({k: v for k, v in tensors.items() if k != name})
    with pytest.raises(TreeMismatch, match=r"^lm_head.bias \(float32\[3\]\) in the HF tensors for vLLM is unexpected$"):
        checker.check_hf({**tensors, "lm_head.bias": np.zeros(3, np.float32)})
