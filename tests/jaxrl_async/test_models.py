"""The NNX Transformer: config parsing, cached decode == uncached forward, jit over split state."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxrl_async.models import KVCache, ModelConfig, Transformer, init_cache


def _forward(cfg):
    graphdef, state = nnx.split(Transformer(cfg, rngs=nnx.Rngs(0)))

    @jax.jit
    def fwd(state, tokens, positions, cache=None):
        return nnx.merge(graphdef, state)(tokens, positions, cache)

    return fwd, state


def _tokens(cfg, b, t, seed=0):
    return jnp.asarray(np.random.RandomState(seed).randint(0, cfg.vocab_size, (b, t)), jnp.int32)


def test_forward_returns_float32_logits_for_both_dtypes():
    for dtype in ("float32", "bfloat16"):
        cfg = ModelConfig.tiny(dtype=dtype)
        fwd, state = _forward(cfg)
        logits, cache = fwd(state, _tokens(cfg, 2, 5), jnp.broadcast_to(jnp.arange(5), (2, 5)))
        assert logits.shape == (2, 5, cfg.vocab_size) and logits.dtype == jnp.float32
        assert cache is None and bool(jnp.isfinite(logits).all())
        assert state["embed"].get_value().dtype == jnp.dtype(dtype)


@pytest.mark.parametrize("overrides", [
    {},
    {"attention_bias": True, "tie_word_embeddings": True},
    {"qk_norm": True, "num_kv_heads": 1},
])
def test_prefill_then_one_token_decode_equals_the_uncached_forward(overrides):
    cfg = ModelConfig.tiny(**overrides)
    fwd, state = _forward(cfg)
    b, t, prompt = 2, 9, 4
    tokens = _tokens(cfg, b, t)
    positions = jnp.broadcast_to(jnp.arange(t), (b, t))
    full, _ = fwd(state, tokens, positions)
    cache = init_cache(cfg, b, 16)
    logits, cache = fwd(state, tokens[:, :prompt], positions[:, :prompt], cache)
    steps = [logits]
    for i in range(prompt, t):
        logits, cache = fwd(state, tokens[:, i:i + 1], positions[:, i:i + 1], cache)
        steps.append(logits)
    np.testing.assert_allclose(jnp.concatenate(steps, axis=1), full, atol=1e-5)


def test_rows_of_a_right_padded_prefill_bucket_decode_independently():
    """Slot-engine use: prompts of lengths 3 and 6 padded to 8, then per-row decode positions."""
    cfg = ModelConfig.tiny()
    fwd, state = _forward(cfg)
    lengths, bucket = (3, 6), 8
    tokens = _tokens(cfg, 2, bucket, seed=1)
    positions = jnp.broadcast_to(jnp.arange(bucket), (2, bucket))
    _, cache = fwd(state, tokens, positions, init_cache(cfg, 2, 12))
    nxt = _tokens(cfg, 2, 1, seed=2)
    step_pos = jnp.asarray([[lengths[0]], [lengths[1]]], jnp.int32)
    decoded, _ = fwd(state, nxt, step_pos, cache)
    for row, n in enumerate(lengths):
        seq = jnp.concatenate([tokens[row:row + 1, :n], nxt[row:row + 1]], axis=1)
        ref, _ = fwd(state, seq, jnp.arange(n + 1)[None])
        np.testing.assert_allclose(decoded[row, 0], ref[0, -1], atol=1e-5)


def test_right_padding_does_not_change_the_logits_of_real_tokens():
    cfg = ModelConfig.tiny()
    fwd, state = _forward(cfg)
    tokens = _tokens(cfg, 1, 10)
    short, _ = fwd(state, tokens[:, :6], jnp.arange(6)[None])
    padded, _ = fwd(state, tokens, jnp.arange(10)[None])
    np.testing.assert_allclose(padded[:, :6], short, atol=1e-6)


def test_cache_is_a_pytree_with_layer_batch_slot_head_dims():
    cfg = ModelConfig.tiny()
    cache = init_cache(cfg, 3, 7, dtype=jnp.bfloat16)
    assert cache.k.shape == (cfg.num_layers, 3, 7, cfg.num_kv_heads, cfg.head_dim)
    assert cache.v.dtype == jnp.bfloat16
    assert isinstance(jax.tree.map(lambda x: x + 1, cache), KVCache)


def test_from_hf_reads_llama_qwen2_and_qwen3_configs():
    base = {"vocab_size": 32, "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1,
            "num_attention_heads": 4, "num_key_value_heads": 2, "eos_token_id": [5, 6]}
    llama = ModelConfig.from_hf({**base, "model_type": "llama", "rope_theta": 5e5,
                                 "rope_scaling": {"type": "linear", "factor": 2.0}})
    assert (llama.head_dim, llama.rope_theta, llama.rope_type) == (4, 5e5, "linear")
    assert llama.eos_token_ids == (5, 6) and not llama.attention_bias
    qwen2 = ModelConfig.from_hf({**base, "architectures": ["Qwen2ForCausalLM"]})
    assert qwen2.attention_bias and not qwen2.qk_norm
    qwen3 = ModelConfig.from_hf({**base, "model_type": "qwen3", "head_dim": 8,
                                 "rope_parameters": {"rope_type": "default", "rope_theta": 1e6}})
    assert qwen3.qk_norm and qwen3.head_dim == 8 and qwen3.rope_scaling is None
    assert ModelConfig.from_hf(qwen3.to_hf()) == qwen3
    assert hash(llama) == hash(ModelConfig.from_hf(llama.to_hf()))


def test_bad_configs_are_one_line_value_errors_naming_the_field():
    base = {"vocab_size": 32, "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1,
            "num_attention_heads": 4}
    with pytest.raises(ValueError, match="unsupported architecture: model_type='gpt2'"):
        ModelConfig.from_hf({**base, "model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]})
    with pytest.raises(ValueError, match="num_kv_heads=3"):
        ModelConfig.tiny(num_kv_heads=3)
    with pytest.raises(ValueError, match="dtype='float16'"):
        ModelConfig.tiny(dtype="float16")
    with pytest.raises(ValueError, match="rope_type='longrope'"):
        ModelConfig.tiny(rope_scaling={"rope_type": "longrope"})
