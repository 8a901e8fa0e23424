"""The NNX Transformer: logits, cached decode == uncached forward, padding and packing, hand-written
gradients."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxrl_async.models import ModelConfig, Transformer
from jaxrl_async.models.attention import KVCache, _attention_fwd, attention, cached_attend, init_cache
from jaxrl_async.models.transformer import _mlp_fwd, forward_layers, inference_logits, inference_weights, mlp


def _forward(cfg):
    graphdef, state = nnx.split(Transformer(cfg, rngs=nnx.Rngs(0)))

    @jax.jit
    def fwd(state, tokens, positions, segments=None):
        return nnx.merge(graphdef, state)(tokens, positions, segments)

    return fwd, state


def _cached_forward(cfg, state):
    """The generation forward: per-layer weights, tokens written into and read from a cache."""
    weights = inference_weights(nnx.to_pure_dict(state))

    @jax.jit
    def fwd(tokens, positions, cache):
        attends = [cached_attend(kt, v, positions) for kt, v in zip(cache.k, cache.v)]
        x, kvs = forward_layers(cfg, weights, tokens, positions, attends)
        return inference_logits(cfg, weights, x), KVCache(k=tuple(k for k, _ in kvs),
                                                          v=tuple(v for _, v in kvs))

    return fwd


def _tokens(cfg, b, t, seed=0):
    return jnp.asarray(np.random.RandomState(seed).randint(0, cfg.vocab_size, (b, t)), jnp.int32)


def test_forward_returns_float32_logits_for_both_dtypes():
    for dtype in ("float32", "bfloat16"):
        cfg = ModelConfig.tiny(dtype=dtype)
        fwd, state = _forward(cfg)
        logits = fwd(state, _tokens(cfg, 2, 5), jnp.broadcast_to(jnp.arange(5), (2, 5)))
        assert logits.shape == (2, 5, cfg.vocab_size) and logits.dtype == jnp.float32
        assert bool(jnp.isfinite(logits).all())
        assert state["embed"].get_value().dtype == jnp.dtype(dtype)


@pytest.mark.parametrize("overrides", [
    {},
    {"attention_bias": True, "tie_word_embeddings": True},
    {"qk_norm": True, "num_kv_heads": 1},
])
def test_prefill_then_one_token_decode_equals_the_uncached_forward(overrides):
    cfg = ModelConfig.tiny(**overrides)
    fwd, state = _forward(cfg)
    cached = _cached_forward(cfg, state)
    b, t, prompt = 2, 9, 4
    tokens = _tokens(cfg, b, t)
    positions = jnp.broadcast_to(jnp.arange(t), (b, t))
    full = fwd(state, tokens, positions)
    cache = init_cache(cfg, b, 16)
    logits, cache = cached(tokens[:, :prompt], positions[:, :prompt], cache)
    steps = [logits]
    for i in range(prompt, t):
        logits, cache = cached(tokens[:, i:i + 1], positions[:, i:i + 1], cache)
        steps.append(logits)
    np.testing.assert_allclose(jnp.concatenate(steps, axis=1), full, atol=1e-5)


def test_rows_of_a_right_padded_prefill_bucket_decode_independently():
    """Slot-engine use: prompts of lengths 3 and 6 padded to 8, then per-row decode positions."""
    cfg = ModelConfig.tiny()
    fwd, state = _forward(cfg)
    cached = _cached_forward(cfg, state)
    lengths, bucket = (3, 6), 8
    tokens = _tokens(cfg, 2, bucket, seed=1)
    positions = jnp.broadcast_to(jnp.arange(bucket), (2, bucket))
    _, cache = cached(tokens, positions, init_cache(cfg, 2, 12))
    nxt = _tokens(cfg, 2, 1, seed=2)
    step_pos = jnp.asarray([[lengths[0]], [lengths[1]]], jnp.int32)
    decoded, _ = cached(nxt, step_pos, cache)
    for row, n in enumerate(lengths):
        seq = jnp.concatenate([tokens[row:row + 1, :n], nxt[row:row + 1]], axis=1)
        ref = fwd(state, seq, jnp.arange(n + 1)[None])
        np.testing.assert_allclose(decoded[row, 0], ref[0, -1], atol=1e-5)


def test_right_padding_does_not_change_the_logits_of_real_tokens():
    cfg = ModelConfig.tiny()
    fwd, state = _forward(cfg)
    tokens = _tokens(cfg, 1, 10)
    short = fwd(state, tokens[:, :6], jnp.arange(6)[None])
    padded = fwd(state, tokens, jnp.arange(10)[None])
    np.testing.assert_allclose(padded[:, :6], short, atol=1e-6)


def test_packed_segments_give_each_sequence_its_own_logits():
    cfg = ModelConfig.tiny()
    fwd, state = _forward(cfg)
    a, b = _tokens(cfg, 1, 5, seed=3), _tokens(cfg, 1, 7, seed=4)
    packed = jnp.concatenate([a, b, jnp.zeros((1, 4), jnp.int32)], axis=1)  # padded to 16
    positions = jnp.concatenate([jnp.arange(5), jnp.arange(7), jnp.zeros(4, jnp.int32)])[None]
    segments = jnp.asarray([[0] * 5 + [1] * 7 + [-1] * 4])
    logits = fwd(state, packed, positions, segments)
    np.testing.assert_allclose(logits[:, :5], fwd(state, a, jnp.arange(5)[None]), atol=1e-5)
    np.testing.assert_allclose(logits[:, 5:12], fwd(state, b, jnp.arange(7)[None]), atol=1e-5)


def test_hand_written_gradients_of_attention_and_mlp_equal_autodiff_of_their_forward():
    rng = np.random.RandomState(0)
    normal = lambda *shape: jnp.asarray(rng.randn(*shape), jnp.float32)  # noqa: E731
    b, t, h, kv, d = 2, 5, 4, 2, 8
    q, kt, v, weight = normal(b, t, h, d), normal(b, kv, d, t), normal(b, kv, t, d), normal(b, t, h, d)
    mask = jnp.broadcast_to(jnp.tril(jnp.ones((t, t), bool)), (b, t, t)).at[1, :, 3:].set(False)
    mask = mask | jnp.eye(t, dtype=bool)  # every query keeps at least itself
    hand = jax.grad(lambda *a: jnp.sum(attention(*a, mask) * weight), argnums=(0, 1, 2))(q, kt, v)
    auto = jax.grad(lambda *a: jnp.sum(_attention_fwd(*a, mask)[0] * weight), argnums=(0, 1, 2))(q, kt, v)
    for got, want in zip(hand, auto, strict=True):
        np.testing.assert_allclose(got, want, atol=1e-5)

    x, w_gate, w_up, w_down, weight = normal(2, 3, 6), normal(6, 10), normal(6, 10), normal(10, 6), normal(2, 3, 6)
    hand = jax.grad(lambda *a: jnp.sum(mlp(*a) * weight), argnums=(0, 1, 2, 3))(x, w_gate, w_up, w_down)
    auto = jax.grad(lambda *a: jnp.sum(_mlp_fwd(*a)[0] * weight), argnums=(0, 1, 2, 3))(x, w_gate, w_up, w_down)
    for got, want in zip(hand, auto, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
