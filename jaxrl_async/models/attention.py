"""Grouped-query attention and the per-layer KV cache that generation reads it against.

`attention` is the one attention product, with a hand-written gradient that recomputes rather
than saves; the training forward, the engine's prefill and decode, and the paged cache's gather
path (engines/jax/paged_attention.py) all call it. `causal_attend` (among a row's own tokens,
packed segments kept apart) and `cached_attend` (against one layer's cache, written first) wrap
it as the `attend` that models/transformer.py's `decoder_layer` calls. The cache lives here
because its layout (keys transposed, values heads-major) is the one the attention's matmuls
read without a per-step transpose. Shapes: q [B, T, H, D] with H = K * G query heads over K
key/value heads; kt [B, K, D, S]; v [B, K, S, D].
"""

from __future__ import annotations

import math

import flax
import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name

from jaxrl_async.models.config import ModelConfig

# The attention's output and log-sum-exp, named with `checkpoint_name` for models/transformer.py's
# REMAT_POLICIES.
ATTN_OUT, ATTN_LSE = "attn_out", "attn_lse"


# ------------------------------------------------------------------------------ KV cache


@flax.struct.dataclass
class KVCache:
    """Keys and values of every layer, one array per layer; row b is one sequence (an engine slot).

    Keys are kept transposed, [B, Hkv, D, S], and values as [B, Hkv, S, D]: both attention
    products of a decode step (q.k^T and p.v) then read their cache operand as a plain [K, N]
    matrix, with no per-step transpose of the cache (which cost XLA:CPU as much as the layer's
    matmuls). One array per layer rather than one [L, ...] array: slicing a layer out of a
    stacked array inside the compiled step copied it.
    """

    k: tuple[jax.Array, ...]  # L x [B, Hkv, D, S]
    v: tuple[jax.Array, ...]  # L x [B, Hkv, S, D]


def init_cache(cfg: ModelConfig, batch: int, max_len: int, dtype=None) -> KVCache:
    """An all-zero cache for `batch` rows of `max_len` positions (dtype defaults to cfg.dtype)."""
    b, kv, d, dtype = batch, cfg.num_kv_heads, cfg.head_dim, jnp.dtype(dtype or cfg.dtype)
    return KVCache(k=tuple(jnp.zeros((b, kv, d, max_len), dtype) for _ in range(cfg.num_layers)),
                   v=tuple(jnp.zeros((b, kv, max_len, d), dtype) for _ in range(cfg.num_layers)))


def write_kv(kt: jax.Array, v: jax.Array, k_new: jax.Array, v_new: jax.Array, rows: jax.Array,
             positions: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Write k_new/v_new [..., Hkv, D] at (rows, positions) (index arrays of shape [...]) of one
    layer's cache (kt [B, Hkv, D, S], v [B, Hkv, S, D]); out-of-range rows or positions are dropped
    (padding)."""
    kt = kt.at[rows, :, :, positions].set(k_new.astype(kt.dtype), mode="drop")
    v = v.at[rows, :, positions].set(v_new.astype(v.dtype), mode="drop")
    return kt, v


# ----------------------------------------------------------------------------- attention


def _q_heads(q: jax.Array, kv_heads: int) -> jax.Array:
    """q [B, T, H, D] -> [B, K, G*T, D] (GQA, G = H / K): the groups fold into the query axis, so
    every attention matmul below is a plain batched [M, K] x [K, N] product."""
    b, t, h, d = q.shape
    return q.reshape(b, t, kv_heads, h // kv_heads, d).transpose(0, 2, 3, 1, 4).reshape(b, kv_heads, -1, d)


def _from_heads(o: jax.Array, t: int) -> jax.Array:
    """[B, K, G*T, D] -> [B, T, K*G, D]."""
    b, kv_heads, gt, d = o.shape
    return o.reshape(b, kv_heads, gt // t, t, d).transpose(0, 3, 1, 2, 4).reshape(b, t, -1, d)


def _masked_scores(qh: jax.Array, kt: jax.Array, mask: jax.Array) -> jax.Array:
    """float32 scores [B, K, G*T, S]; masked entries hold the float32 minimum."""
    b, kv_heads, gt, d = qh.shape
    scores = jnp.matmul(qh, kt, preferred_element_type=jnp.float32) / math.sqrt(d)
    scores = scores.reshape(b, kv_heads, gt // mask.shape[1], *mask.shape[1:])  # [B, K, G, T, S]
    scores = jnp.where(mask[:, None, None], scores, jnp.finfo(jnp.float32).min)
    return scores.reshape(b, kv_heads, gt, -1)


@jax.custom_vjp
def attention(q: jax.Array, kt: jax.Array, v: jax.Array, mask: jax.Array) -> jax.Array:
    """Grouped-query attention. q [B, T, H, D]; kt [B, K, D, S]; v [B, K, S, D]; mask [B, T, S]
    -> [B, T, H, D].

    Keys arrive transposed and values heads-major (the KV cache's layout), so only the small
    per-token tensors are ever transposed, never the [T, S] scores (XLA:CPU transposed those
    element by element). Softmax in float32. The gradient is hand-written (as in FlashAttention,
    Dao et al. 2022): the backward pass recomputes the probabilities from q, k and the
    log-sum-exp instead of saving [B, H, T, S] tensors per layer.
    """
    return _attention_fwd(q, kt, v, mask)[0]


def _attention_fwd(q, kt, v, mask):
    qh = _q_heads(q, kt.shape[1])
    scores = _masked_scores(qh, kt, mask)
    top = jnp.max(scores, axis=-1, keepdims=True)
    exp = jnp.exp(scores - top)
    total = jnp.sum(exp, axis=-1, keepdims=True)
    out = jnp.matmul((exp / total).astype(v.dtype), v)  # [B, K, G*T, D]
    lse = top + jnp.log(total)  # [B, K, G*T, 1]
    # Named for transformer.py's REMAT_POLICIES: with these two kept, a rematerialised layer's
    # backward pass does not recompute the quadratic forward above (the backward recomputes the
    # scores regardless).
    out, lse = checkpoint_name(out, ATTN_OUT), checkpoint_name(lse, ATTN_LSE)
    return _from_heads(out, q.shape[1]), (q, kt, v, mask, out, lse)


def _attention_bwd(res, d_out):
    q, kt, v, mask, out, lse = res
    qh, d_oh = _q_heads(q, kt.shape[1]), _q_heads(d_out, kt.shape[1])  # [B, K, G*T, D]
    probs = jnp.exp(_masked_scores(qh, kt, mask) - lse)  # [B, K, G*T, S] f32
    d_probs = jnp.matmul(d_oh, jnp.swapaxes(v, -1, -2), preferred_element_type=jnp.float32)
    delta = jnp.sum(d_oh.astype(jnp.float32) * out.astype(jnp.float32), axis=-1, keepdims=True)
    d_scores = (probs * (d_probs - delta) / math.sqrt(q.shape[-1])).astype(q.dtype)
    dq = _from_heads(jnp.matmul(d_scores, jnp.swapaxes(kt, -1, -2)), q.shape[1])
    dkt = jnp.matmul(jnp.swapaxes(qh, -1, -2), d_scores)  # [B, K, D, S]
    dv = jnp.swapaxes(jnp.matmul(jnp.swapaxes(d_oh, -1, -2), probs.astype(v.dtype)), -1, -2)
    return dq, dkt, dv, None


attention.defvjp(_attention_fwd, _attention_bwd)


def causal_attend(segments: jax.Array | None = None):
    """Self-attention among the T tokens of each row: causal by index, and only within a segment.

    segments [B, T] int32 (None: one segment per row) lets a row hold several packed prompts:
    a token attends to the earlier tokens of its own segment only. Right padding only sees real
    tokens before it. Returns an `attend` for `decoder_layer` whose aux is the layer's (k, v).
    """

    def attend(q, k, v):
        t = q.shape[1]
        mask = jnp.arange(t)[None, :] <= jnp.arange(t)[:, None]  # [T, T]
        if segments is None:
            mask = jnp.broadcast_to(mask, (q.shape[0], t, t))
        else:
            mask = mask & (segments[:, :, None] == segments[:, None, :])
        out = attention(q, k.transpose(0, 2, 3, 1), v.transpose(0, 2, 1, 3), mask)
        return out, (k, v)

    return attend


def cached_attend(kt: jax.Array, v: jax.Array, positions: jax.Array, length: int | None = None,
                  write_positions: jax.Array | None = None):
    """Attention against one layer's KV cache (kt [B, K, D, S], v [B, K, S, D]).

    Token (b, t) is written at cache index write_positions[b, t] of row b (default: its
    position; indices past the end are dropped, which is how a caller skips a row's write), then
    a query at position p attends to indices j <= p of its own row only. Index p is always
    written before a query at p reads it, so stale values past a sequence's position are never
    read. `length` (static, <= S) reads only indices [0, length) of the cache: a decode step whose
    positions are all < length costs what a `length`-token context costs, not S. Returns an
    `attend` whose aux is the updated (kt, v).
    """
    write_positions = positions if write_positions is None else write_positions
    length = kt.shape[-1] if length is None else length

    def attend(q, k, v_new):
        rows = jnp.broadcast_to(jnp.arange(q.shape[0])[:, None], positions.shape)
        new_kt, new_v = write_kv(kt, v, k, v_new, rows, write_positions)
        live_kt, live_v = new_kt[..., :length], new_v[:, :, :length]  # [B, K, D, L], [B, K, L, D]
        mask = jnp.arange(length)[None, None, :] <= positions[:, :, None]  # [B, T, L]
        out = attention(q, live_kt.astype(q.dtype), live_v.astype(q.dtype), mask)
        return out, (new_kt, new_v)

    return attend
