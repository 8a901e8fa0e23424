"""Rotary position embeddings (RoPE, Su et al. 2021): the cos/sin tables of token positions and
the rotation of q and k by them.

The inverse frequencies follow transformers' `modeling_rope_utils` for the rope types a model's
config can name (default, linear, llama3, yarn, dynamic), and the rotation uses the rotate-half
layout of HF checkpoints, so loaded q/k weights need no permutation. The tables depend on the
config and the positions only, never on a parameter: the forward (models/transformer.py
`_embed`) computes them once per call and every layer rotates with the same pair. To support
another rope type: its rule in `rope_inv_freq` (or, if it depends on the sequence, in
`rope_cos_sin`).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_async.models.config import ModelConfig


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
