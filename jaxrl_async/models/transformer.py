"""Decoder-only LM for the Llama / Qwen2 / Qwen3 family, in Flax NNX.

Read top to bottom: RoPE tables, RMSNorm, the KV cache, attention (GQA, optional Qwen biases
and q/k norm), SwiGLU MLP, one decoder layer, the remat policies of the layer scan, the
`Transformer`, and the generation forward.

Two layouts of the same parameters, for two jobs:
- training / scoring (`Transformer.__call__`): layer parameters stacked along a leading `layers`
  axis and scanned with `jax.lax.scan`, so compile time does not grow with depth;
- generation (`inference_weights` + `forward_layers`): one array per layer and an unrolled loop,
  with a per-layer KV cache. On CPU, slicing a layer out of a stack inside a compiled decode step
  copies it, every step; per-layer arrays are read in place (the copies are about a third of a
  stacked decode step for SmolLM2-135M on 2 cores).
Every parameter declares its logical axes once, as Variable metadata (`logical_axes`);
`jaxrl_async.sharding` derives shardings from them.

Numerics follow transformers' Llama: RMSNorm in float32 then cast back, RoPE with the
rotate-half layout, softmax in float32. Attention scores are accumulated in float32
(transformers keeps them in the activation dtype), which only matters for bfloat16. Attention
and the SwiGLU MLP have hand-written gradients that recompute rather than save (see `attention`
and `mlp`).

Deliberately left out: sliding-window attention, MoE, attention/logit soft-capping.
"""

from __future__ import annotations

import math
from functools import partial

import flax
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.ad_checkpoint import checkpoint_name

from jaxrl_async.models.config import ModelConfig
from jaxrl_async.models.lora import LoraAdapter, ResidentAdapters, TokenAdapters, adapter_output, merge_layers

# Logical axis names used in `logical_axes` metadata (see jaxrl_async/sharding.py).
LAYERS, VOCAB, EMBED, HEADS, KV_HEADS, HEAD_DIM, MLP = (
    "layers", "vocab", "embed", "heads", "kv_heads", "head_dim", "mlp")

# The attention's output and log-sum-exp, named with `checkpoint_name` for REMAT_POLICIES.
ATTN_OUT, ATTN_LSE = "attn_out", "attn_lse"


def _dtype(cfg: ModelConfig) -> jnp.dtype:
    return jnp.dtype(cfg.dtype)


# ----------------------------------------------------------------------------------- RoPE


def rope_inv_freq(cfg: ModelConfig) -> tuple[np.ndarray, float]:
    """Inverse frequencies [D/2] and the attention factor of cos/sin, for the static rope types.

    Follows transformers' `modeling_rope_utils` (default, linear, llama3, yarn); `dynamic`
    depends on the sequence length and is handled in `rope_cos_sin`.
    """
    d, base = cfg.head_dim, cfg.rope_theta
    exponents = np.arange(0, d, 2, dtype=np.float32) / d
    inv_freq = (1.0 / base ** exponents).astype(np.float32)
    rope, kind = cfg.rope_scaling or {}, cfg.rope_type
    if kind in ("default", "dynamic"):
        return inv_freq, 1.0
    if kind == "linear":
        return inv_freq / np.float32(rope["factor"]), 1.0
    if kind == "llama3":
        factor, low, high = rope["factor"], rope["low_freq_factor"], rope["high_freq_factor"]
        old_len = rope["original_max_position_embeddings"]
        wavelen = 2 * math.pi / inv_freq
        scaled = np.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
        smooth = (old_len / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = (wavelen >= old_len / high) & (wavelen <= old_len / low)
        return np.where(medium, smoothed, scaled).astype(np.float32), 1.0
    if kind == "yarn":
        return _yarn_inv_freq(cfg, exponents)
    raise ValueError(f"rope_type={kind!r} has no inverse-frequency rule")


def _yarn_inv_freq(cfg: ModelConfig, exponents: np.ndarray) -> tuple[np.ndarray, float]:
    """YaRN (Peng et al. 2023): interpolate low frequencies, keep high ones, scale attention."""
    rope, d, base = cfg.rope_scaling, cfg.head_dim, cfg.rope_theta
    factor = rope["factor"]
    original = rope.get("original_max_position_embeddings") or cfg.max_position_embeddings

    def mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    attention_factor = rope.get("attention_factor")
    if attention_factor is None:
        if rope.get("mscale") and rope.get("mscale_all_dim"):
            attention_factor = mscale(factor, rope["mscale"]) / mscale(factor, rope["mscale_all_dim"])
        else:
            attention_factor = mscale(factor)

    def correction_dim(rotations: float) -> float:
        return d * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low = correction_dim(rope.get("beta_fast") or 32)
    high = correction_dim(rope.get("beta_slow") or 1)
    if rope.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, d - 1)
    if low == high:
        high += 0.001
    ramp = np.clip((np.arange(d // 2, dtype=np.float32) - low) / (high - low), 0, 1)
    extrapolation = 1 - ramp
    pos_freqs = base ** exponents
    inv_freq = (1 / (factor * pos_freqs)) * (1 - extrapolation) + (1 / pos_freqs) * extrapolation
    return inv_freq.astype(np.float32), float(attention_factor)


def rope_cos_sin(cfg: ModelConfig, positions: jax.Array) -> tuple[jax.Array, jax.Array]:
    """cos, sin [B, T, D] (float32) for integer positions [B, T]."""
    inv_freq, attention_factor = rope_inv_freq(cfg)
    inv_freq = jnp.asarray(inv_freq)  # [D/2]
    if cfg.rope_type == "dynamic":
        # Dynamic NTK: past the trained length, grow the base with the longest position seen
        # in this call (transformers' `dynamic_rope_update` does the same per forward).
        d, factor = cfg.head_dim, cfg.rope_scaling["factor"]
        max_len = cfg.rope_scaling.get("original_max_position_embeddings") or cfg.max_position_embeddings
        seq_len = jnp.maximum(jnp.max(positions) + 1, max_len).astype(jnp.float32)
        base = cfg.rope_theta * ((factor * seq_len / max_len) - (factor - 1)) ** (d / (d - 2))
        inv_freq = 1.0 / base ** (jnp.arange(0, d, 2, dtype=jnp.float32) / d)
    freqs = positions.astype(jnp.float32)[..., None] * inv_freq  # [B, T, D/2]
    emb = jnp.concatenate([freqs, freqs], axis=-1)  # [B, T, D]
    return jnp.cos(emb) * attention_factor, jnp.sin(emb) * attention_factor


def apply_rope(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """x [B, T, H, D] rotated by cos/sin [B, T, D] (rotate-half layout, as in HF checkpoints)."""
    half = x.shape[-1] // 2
    rotated = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    cos, sin = cos[:, :, None, :].astype(x.dtype), sin[:, :, None, :].astype(x.dtype)
    return x * cos + rotated * sin


# -------------------------------------------------------------------------------- RMSNorm


def rms_norm(x: jax.Array, weight: jax.Array, eps: float) -> jax.Array:
    """RMSNorm over the last axis, computed in float32 and cast back before the weight."""
    x32 = x.astype(jnp.float32)
    x32 = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    return weight * x32.astype(x.dtype)


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
    # Named for REMAT_POLICIES: with these two kept, a rematerialised layer's backward pass does
    # not recompute the quadratic forward above (the backward recomputes the scores regardless).
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


def dense(x: jax.Array, w: jax.Array, in_axes: int = 1) -> jax.Array:
    """x [..., I] times w [I..., O...] (the first `in_axes` axes of w are contracted) -> [..., O...].

    The token axes are flattened into one so that each weight gradient is a plain 2-D matmul:
    contracting batch and time as two axes made XLA:CPU transpose the [B, T, F] activation
    gradient element by element before the matmul, which cost more than the matmuls themselves.
    """
    in_shape, out_shape = w.shape[:in_axes], w.shape[in_axes:]
    lead = x.shape[:x.ndim - in_axes]
    y = x.reshape(-1, math.prod(in_shape)) @ w.reshape(math.prod(in_shape), -1)
    return y.reshape(*lead, *out_shape)


@jax.custom_vjp
def mlp(h: jax.Array, w_gate: jax.Array, w_up: jax.Array, w_down: jax.Array) -> jax.Array:
    """SwiGLU MLP: (silu(h @ w_gate) * (h @ w_up)) @ w_down; h [..., E] -> [..., E].

    The gradient is hand-written: it saves h, gate and up and recomputes silu(gate) * up in the
    backward pass. Autodiff saved four [tokens, F] activations per layer, and zero-filling and
    writing them into the layer scan's stacked residuals cost more than the elementwise
    recompute (train step 8-12% faster). Tokens are flattened as in `dense`.
    """
    return _mlp_fwd(h, w_gate, w_up, w_down)[0]


def _mlp_fwd(h, w_gate, w_up, w_down):
    h2 = h.reshape(-1, h.shape[-1])  # [N, E]
    gate, up = h2 @ w_gate, h2 @ w_up  # [N, F]
    y = (jax.nn.silu(gate) * up) @ w_down
    return y.reshape(h.shape), (h2, gate, up, w_gate, w_up, w_down)


def _mlp_bwd(res, d_y):
    h2, gate, up, w_gate, w_up, w_down = res
    d_y2 = d_y.reshape(-1, d_y.shape[-1])
    sig = jax.nn.sigmoid(gate)
    silu = gate * sig
    d_w_down = (silu * up).T @ d_y2
    d_act = d_y2 @ w_down.T  # [N, F]
    d_gate = d_act * up * (sig * (1 + gate * (1 - sig)))  # silu'(g) = sig(g) (1 + g (1 - sig(g)))
    d_up = d_act * silu
    d_h = d_gate @ w_gate.T + d_up @ w_up.T
    return d_h.reshape(d_y.shape), h2.T @ d_gate, h2.T @ d_up, d_w_down


mlp.defvjp(_mlp_fwd, _mlp_bwd)


def adapted_dense(x: jax.Array, p: dict, name: str, lora: TokenAdapters | None, in_axes: int = 1) -> jax.Array:
    """`dense(x, p[name])`, plus the token's resident adapter's side branch when `lora` adapts
    `name` (models/lora.py `adapter_output`: y = x W + scale (x A[v]) B[v], unmerged)."""
    y = dense(x, p[name], in_axes)
    if lora is not None and name in lora.params:
        y = y + adapter_output(x, lora.params[name], lora.select, lora.scale, in_axes)
    return y


def decoder_layer(cfg: ModelConfig, p: dict, x: jax.Array, cos: jax.Array, sin: jax.Array, attend,
                  lora: TokenAdapters | None = None):
    """One pre-norm block. x [B, T, E]; p holds this layer's parameters (no layer axis).

    `attend(q [B, T, H, D], k, v [B, T, K, D]) -> (out [B, T, H, D], aux)` is the attention
    (`causal_attend` or `cached_attend`); returns (x, aux). `lora` (generation only, no gradient):
    resident adapters applied unmerged per token (`adapted_dense`); None runs the weights alone.
    """
    h = rms_norm(x, p["attn_norm"], cfg.rms_norm_eps)  # [B, T, E]
    q = adapted_dense(h, p, "wq", lora)  # [B, T, H, D]
    k = adapted_dense(h, p, "wk", lora)  # [B, T, K, D]
    v = adapted_dense(h, p, "wv", lora)  # [B, T, K, D]
    if cfg.attention_bias:
        q, k, v = q + p["bq"], k + p["bk"], v + p["bv"]
    if cfg.qk_norm:
        q = rms_norm(q, p["q_norm"], cfg.rms_norm_eps)
        k = rms_norm(k, p["k_norm"], cfg.rms_norm_eps)
    q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    attn, aux = attend(q, k, v)
    x = x + adapted_dense(attn, p, "wo", lora, in_axes=2)

    h = rms_norm(x, p["mlp_norm"], cfg.rms_norm_eps)
    if lora is None:
        x = x + mlp(h, p["w_gate"], p["w_up"], p["w_down"])
    else:  # the MLP's forward with each projection adapted (no custom gradient needed here)
        act = jax.nn.silu(adapted_dense(h, p, "w_gate", lora)) * adapted_dense(h, p, "w_up", lora)
        x = x + adapted_dense(act, p, "w_down", lora)
    return x, aux


# --------------------------------------------------------------------------------- model


def param_specs(cfg: ModelConfig) -> dict[str, tuple[tuple[int, ...], tuple[str | None, ...], str]]:
    """Every parameter, declared once: path -> (shape, logical axes, init).

    Paths under `layers/` are stacked over a leading `layers` axis. Init follows HF
    (normal(0.02) weights, unit norms, zero biases).
    """
    L, E, H, K, D, F, V = (cfg.num_layers, cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads,
                           cfg.head_dim, cfg.intermediate_size, cfg.vocab_size)
    specs = {
        "embed": ((V, E), (VOCAB, EMBED), "normal"),
        "layers/attn_norm": ((L, E), (LAYERS, None), "ones"),
        "layers/wq": ((L, E, H, D), (LAYERS, EMBED, HEADS, HEAD_DIM), "normal"),
        "layers/wk": ((L, E, K, D), (LAYERS, EMBED, KV_HEADS, HEAD_DIM), "normal"),
        "layers/wv": ((L, E, K, D), (LAYERS, EMBED, KV_HEADS, HEAD_DIM), "normal"),
        "layers/wo": ((L, H, D, E), (LAYERS, HEADS, HEAD_DIM, EMBED), "normal"),
    }
    if cfg.attention_bias:
        specs["layers/bq"] = ((L, H, D), (LAYERS, HEADS, HEAD_DIM), "zeros")
        specs["layers/bk"] = ((L, K, D), (LAYERS, KV_HEADS, HEAD_DIM), "zeros")
        specs["layers/bv"] = ((L, K, D), (LAYERS, KV_HEADS, HEAD_DIM), "zeros")
    if cfg.qk_norm:
        specs["layers/q_norm"] = ((L, D), (LAYERS, None), "ones")
        specs["layers/k_norm"] = ((L, D), (LAYERS, None), "ones")
    specs.update({
        "layers/mlp_norm": ((L, E), (LAYERS, None), "ones"),
        "layers/w_gate": ((L, E, F), (LAYERS, EMBED, MLP), "normal"),
        "layers/w_up": ((L, E, F), (LAYERS, EMBED, MLP), "normal"),
        "layers/w_down": ((L, F, E), (LAYERS, MLP, EMBED), "normal"),
        "final_norm": ((E,), (None,), "ones"),
    })
    if not cfg.tie_word_embeddings:
        specs["lm_head"] = ((E, V), (EMBED, VOCAB), "normal")
    return specs


def layer_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """{name: stacked shape} of the layers' parameters (`param_specs` under `layers/`)."""
    return {path.split("/", 1)[1]: shape for path, (shape, _, _) in param_specs(cfg).items()
            if path.startswith("layers/")}


@partial(jax.jit, static_argnums=(1, 2))
def _init_values(key: jax.Array, shapes_inits: tuple, dtype) -> tuple[jax.Array, ...]:
    # One jitted call and one random draw for all weights: eager jax.random compiles per op and
    # shape, and one threefry per tensor makes compilation slow.
    sizes = [math.prod(shape) if init == "normal" else 0 for shape, init in shapes_inits]
    flat = 0.02 * jax.random.normal(key, (sum(sizes),), jnp.float32)
    out, offset = [], 0
    for (shape, init), size in zip(shapes_inits, sizes):
        if init == "ones":
            out.append(jnp.ones(shape, dtype))
        elif init == "zeros":
            out.append(jnp.zeros(shape, dtype))
        else:
            out.append(flat[offset:offset + size].reshape(shape).astype(dtype))
        offset += size
    return tuple(out)


def _init_params(cfg: ModelConfig, rngs: nnx.Rngs) -> dict[str, nnx.Param]:
    specs = param_specs(cfg)
    values = _init_values(rngs.params(), tuple((sh, init) for sh, _, init in specs.values()),
                          _dtype(cfg))
    return {path: nnx.Param(value, logical_axes=axes)
            for (path, (_, axes, _)), value in zip(specs.items(), values)}


class DecoderLayers(nnx.Module):
    """Parameters of all layers, stacked on a leading `layers` axis (scanned by Transformer)."""

    def __init__(self, params: dict[str, nnx.Param]):
        for name, param in params.items():
            setattr(self, name, param)

    def stacked(self) -> dict[str, jax.Array]:
        return {name: var.get_value() for name, var in vars(self).items() if isinstance(var, nnx.Param)}


def _embed(cfg: ModelConfig, embed: jax.Array, tokens: jax.Array, positions: jax.Array):
    """Token embeddings [B, T, E] and the RoPE tables of the positions."""
    return embed[tokens], *rope_cos_sin(cfg, positions)


def unembedding(cfg: ModelConfig, embed: jax.Array, lm_head: jax.Array | None) -> jax.Array:
    """The LM head as an [E, V] matrix: the embedding's transpose when tied (a transposed
    operand, not a copy), else `lm_head`."""
    return embed.T if cfg.tie_word_embeddings else lm_head


def project_logits(x: jax.Array, head: jax.Array) -> jax.Array:
    """Final-normed hidden states x [..., E] times the head [E, V] -> float32 logits [..., V].

    Tokens are flattened as in `dense`. The one rule for logits: the full forward and the
    trainer's chunked log-probs (jaxrl_async/trainer/step.py) both call it."""
    logits = jnp.dot(x.reshape(-1, x.shape[-1]), head, preferred_element_type=jnp.float32)
    return logits.reshape(*x.shape[:-1], -1).astype(jnp.float32)


def _logits(cfg: ModelConfig, x: jax.Array, final_norm: jax.Array, embed: jax.Array,
            lm_head: jax.Array | None) -> jax.Array:
    """Final norm and LM head: x [B, T, E] -> float32 logits [B, T, V]."""
    x = rms_norm(x, final_norm, cfg.rms_norm_eps)
    return project_logits(x, unembedding(cfg, embed, lm_head))


# Rematerialisation (`Transformer.__call__(remat=...)`, `TrainerConfig.remat`): the scanned layer
# runs under `jax.checkpoint` with one of these policies, which says what its backward pass may
# keep; the rest is recomputed from the layer's input (the scan carry, always kept). "none" does
# not wrap the layer: autodiff keeps what it needs, the attention and MLP their custom_vjp
# residuals. To add one: a name and a `jax.checkpoint_policies` policy; the config validates
# against REMAT_CHOICES.
_cp = jax.checkpoint_policies
_ATTENTION = _cp.save_only_these_names(ATTN_OUT, ATTN_LSE)
REMAT_POLICIES = {
    # The layer input only: the backward pass runs every layer's forward again.
    "full": _cp.nothing_saveable,
    # Every matmul output, so only elementwise ops (norms, RoPE, SiLU) are recomputed; inside the
    # attention that is its output and log-sum-exp. Plain `dots_saveable` would keep the float32
    # [T, S] score matrices instead, more than "none" keeps (1.3x the step's temporary memory at
    # benchmarks/bench_remat.py's 4.7b shape), since the hand-written attention backward
    # recomputes them.
    "dots": _cp.save_from_both_policies(_cp.dots_saveable, _ATTENTION),
    # The matmuls without batch dimensions (projections, MLP); the attention is recomputed.
    "dots_no_batch": _cp.dots_with_no_batch_dims_saveable,
    # The attention's output and log-sum-exp only: about "full"'s memory (one [B, T, H, D]
    # activation more per layer) without recomputing the quadratic attention forward.
    "save_attn": _ATTENTION,
}
REMAT_CHOICES = ("none", *REMAT_POLICIES)


class Transformer(nnx.Module):
    """Token ids -> float32 logits: the training / teacher-forced scoring forward.

    The layers run under `jax.lax.scan` over the stacked parameters, so compile time does not
    grow with depth (this graph is also differentiated). Generation uses the same layers through
    `InferenceWeights` and `forward_layers` instead.
    """

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        params = _init_params(cfg, rngs)
        self.embed = params["embed"]
        self.layers = DecoderLayers({path.split("/", 1)[1]: p for path, p in params.items()
                                     if path.startswith("layers/")})
        self.final_norm = params["final_norm"]
        if not cfg.tie_word_embeddings:
            self.lm_head = params["lm_head"]

    def __call__(self, tokens: jax.Array, positions: jax.Array,
                 segments: jax.Array | None = None, *, remat: str = "none",
                 adapter: LoraAdapter | None = None) -> jax.Array:
        """tokens/positions int32 [B, T] -> float32 logits [B, T, V].

        Causal attention among the T tokens of a row (right padding is harmless); with
        `segments` [B, T], only among tokens of the same segment (packed sequences). `adapter`
        (models/lora.py) is merged into each layer's weights as the scan reaches it.
        """
        return project_logits(self.hidden_states(tokens, positions, segments, remat=remat, adapter=adapter),
                              self.head())

    def head(self) -> jax.Array:
        """The LM head as [E, V] (`unembedding`): `project_logits(hidden_states(...), head())`
        are the logits of `__call__`."""
        return unembedding(self.cfg, self.embed[...], None if self.cfg.tie_word_embeddings else self.lm_head[...])

    def hidden_states(self, tokens: jax.Array, positions: jax.Array, segments: jax.Array | None = None, *,
                      remat: str = "none", adapter: LoraAdapter | None = None) -> jax.Array:
        """The last layer's output after the final norm, [B, T, E] in the params' dtype: what the
        LM head multiplies, for a caller that computes the logits in pieces (the trainer's
        `logits_chunk`) instead of as one [B, T, V] array."""
        cfg = self.cfg
        x, cos, sin = _embed(cfg, self.embed[...], tokens, positions)
        attend = causal_attend(segments)

        def layer(x, p):
            if adapter is not None:  # one layer's weights and adapter: merged here, so only the
                p = merge_layers(*p, adapter.scale)  # adapter's slice is differentiated
            return decoder_layer(cfg, p, x, cos, sin, attend)[0], None

        if remat != "none":
            # prevent_cse=False: the scan already keeps XLA from merging the recompute back into
            # the forward pass, so prevent_cse's optimization barriers would only constrain it.
            layer = jax.checkpoint(layer, policy=REMAT_POLICIES[remat], prevent_cse=False)
        xs = self.layers.stacked() if adapter is None else (self.layers.stacked(), adapter.params["layers"])
        x, _ = jax.lax.scan(layer, x, xs)
        return rms_norm(x, self.final_norm[...], cfg.rms_norm_eps)


# ------------------------------------------------------------------- generation forward


def inference_weights(params: dict) -> dict:
    """The parameters in the generation layout: a tuple of per-layer dicts under "layers".

    `params` is `nnx.to_pure_dict` of the model's `nnx.Param` state (stacked layers). Under jit
    this copies every layer out of the stack once, when weights are installed, instead of in
    every decode step (XLA:CPU copied each layer's slice of the stacked weights per step: about
    half of a batch-1 decode step). The same weights, the same numerics; on GPU/TPU it costs one
    copy per weight update.
    """
    layers = params["layers"]
    num_layers = next(iter(layers.values())).shape[0]
    out = {name: value for name, value in params.items() if name != "layers"}
    out["layers"] = tuple({name: value[i] for name, value in layers.items()} for i in range(num_layers))
    return out


def forward_layers(cfg: ModelConfig, weights: dict, tokens: jax.Array, positions: jax.Array,
                   attends, rows: jax.Array | None = None) -> tuple[jax.Array, list]:
    """Embedding and every layer over `inference_weights`, one `attend` per layer (unrolled).

    Weights holding "adapters" (`ResidentAdapters`: the engine's pinned versions) adapt each
    token with its slot's entry; rows [B, T] int32 names each token's slot (clipped into range,
    so padding takes some slot's entry and is dropped anyway). Returns the last hidden state
    [B, T, E] (before the final norm) and each layer's aux.
    """
    x, cos, sin = _embed(cfg, weights["embed"], tokens, positions)
    resident: ResidentAdapters | None = weights.get("adapters")
    select = None
    if resident is not None:
        entries = jnp.take(resident.slot_entry, rows, mode="clip")  # [B, T]
        select = jax.nn.one_hot(entries, next(iter(resident.layers[0].values()))["a"].shape[0], dtype=jnp.float32)
    auxes = []
    for i, (p, attend) in enumerate(zip(weights["layers"], attends, strict=True)):
        lora = None if resident is None else TokenAdapters(resident.layers[i], select, resident.scale)
        x, aux = decoder_layer(cfg, p, x, cos, sin, attend, lora)
        auxes.append(aux)
    return x, auxes


def inference_logits(cfg: ModelConfig, weights: dict, x: jax.Array) -> jax.Array:
    """Final norm and LM head over `inference_weights`: x [B, T, E] -> float32 logits [B, T, V]."""
    return _logits(cfg, x, weights["final_norm"], weights["embed"], weights.get("lm_head"))
