"""Decode attention over a paged KV cache: an XLA gather path and a Pallas kernel.

The paged cache (`init_paged_cache`) keeps each layer's keys as [P pages, Hkv, D, page_size] and
values as [P, Hkv, page_size, D] — the contiguous cache's layout (attention.KVCache) with the
batch axis replaced by pages and the sequence axis cut into pages. A slot's page table row
[n] names the pages of its positions [0, n * page_size).

Two implementations of one contract, `decode(q, k_pages, v_pages, table, positions)`: q [S, 1, H, D]
(one token per slot), table [S, n] int32 (entries past a slot's pages may hold any id; they
are masked), positions [S] int32; slot s attends to its positions j <= positions[s] -> [S, 1, H, D].

- "xla" (`gather_attention`): gathers the n pages of every slot into a contiguous [S, Hkv, D, n *
  page_size] view and runs the model's own `attention` on it, so on the same live length it
  computes exactly what the contiguous engine computes (masked entries weigh exactly 0). Runs
  on every backend; it reads n pages per slot, so its cost follows the live bucket, not max_len.
- "pallas" (`pallas_attention`): one program per (slot, kv head) walks only the slot's live pages
  (positions // page_size + 1 of them) with an online softmax (FlashAttention's recurrence,
  Dao et al. 2022), reading each page in place instead of gathering a copy. Tested on CPU in
  interpret mode against "xla"; on GPU/TPU it compiles through Pallas's Triton / Mosaic lowering.

`KERNELS` maps a backend (jax's platform name) to the implementation it uses; a backend not
listed uses "xla". To add an implementation: a function of the contract above and an entry in
`IMPLEMENTATIONS`.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from jaxrl_async.models.attention import KVCache, attention, write_kv
from jaxrl_async.models.config import ModelConfig


def init_paged_cache(cfg: ModelConfig, pages: int, page_size: int, dtype=None) -> KVCache:
    """An all-zero paged cache: per layer k [pages, Hkv, D, page_size], v [pages, Hkv, page_size, D].
    Zeros matter: a masked read of a never-written page must be finite (0 * it = 0)."""
    kv, d, dtype = cfg.num_kv_heads, cfg.head_dim, jnp.dtype(dtype or cfg.dtype)
    return KVCache(k=tuple(jnp.zeros((pages, kv, d, page_size), dtype) for _ in range(cfg.num_layers)),
                   v=tuple(jnp.zeros((pages, kv, page_size, d), dtype) for _ in range(cfg.num_layers)))


def gather_attention(q: jax.Array, k_pages: jax.Array, v_pages: jax.Array, table: jax.Array,
                     positions: jax.Array) -> jax.Array:
    """The "xla" implementation (see the module docstring)."""
    s, n = table.shape
    _, kv, d, ps = k_pages.shape
    idx = jnp.minimum(table, k_pages.shape[0] - 1)  # sentinel entries read a real page, masked below
    kt = k_pages[idx].transpose(0, 2, 3, 1, 4).reshape(s, kv, d, n * ps)  # [S, K, D, L]
    v = v_pages[idx].transpose(0, 2, 1, 3, 4).reshape(s, kv, n * ps, d)  # [S, K, L, D]
    mask = jnp.arange(n * ps)[None, None, :] <= positions[:, None, None]  # [S, 1, L]
    return attention(q, kt.astype(q.dtype), v.astype(q.dtype), mask)


def _paged_kernel(pos_ref, table_ref, q_ref, k_ref, v_ref, o_ref, *, page_size: int, num_pages: int):
    """One (slot, kv head): q_ref [1, 1, G, D]; k_ref/v_ref the whole page arrays; o_ref like q_ref."""
    head = pl.program_id(1)
    pos = pos_ref[0]
    q = q_ref[0, 0].astype(jnp.float32) / math.sqrt(q_ref.shape[-1])  # [G, D]
    g, d = q.shape

    def body(i, carry):
        top, total, acc = carry  # [G, 1], [G, 1], [G, D]
        page = table_ref[0, i]
        kt = k_ref[page, head].astype(jnp.float32)  # [D, ps]
        scores = jnp.dot(q, kt, preferred_element_type=jnp.float32)  # [G, ps]
        index = i * page_size + jax.lax.broadcasted_iota(jnp.int32, (g, page_size), 1)
        scores = jnp.where(index <= pos, scores, -jnp.inf)
        new_top = jnp.maximum(top, jnp.max(scores, axis=-1, keepdims=True))
        scale = jnp.exp(top - new_top)
        p = jnp.exp(scores - new_top)
        v = v_ref[page, head].astype(jnp.float32)  # [ps, D]
        acc = acc * scale + jnp.dot(p, v, preferred_element_type=jnp.float32)
        return new_top, total * scale + jnp.sum(p, axis=-1, keepdims=True), acc

    live = jnp.minimum(pos // page_size + 1, num_pages)  # the pages that hold positions <= pos
    init = (jnp.full((g, 1), -jnp.inf, jnp.float32), jnp.zeros((g, 1), jnp.float32),
            jnp.zeros((g, d), jnp.float32))
    _, total, acc = jax.lax.fori_loop(0, live, body, init)
    o_ref[0, 0] = (acc / total).astype(o_ref.dtype)


def pallas_attention(q: jax.Array, k_pages: jax.Array, v_pages: jax.Array, table: jax.Array,
                     positions: jax.Array, *, interpret: bool = False) -> jax.Array:
    """The "pallas" implementation (see the module docstring); interpret=True runs it anywhere."""
    s, t, h, d = q.shape
    assert t == 1, f"pallas_attention decodes one token per slot, got T={t}"
    kv, ps, n = k_pages.shape[1], k_pages.shape[-1], table.shape[1]
    g = h // kv
    qh = q.reshape(s, kv, g, d)  # heads k*G + g, as attention._q_heads groups them
    # The query rows of a kv head padded to a power of two >= 16: Triton's dot needs both.
    rows = max(16, 1 << (g - 1).bit_length())
    qh = jnp.pad(qh, ((0, 0), (0, 0), (0, rows - g), (0, 0)))
    table = jnp.minimum(table, k_pages.shape[0] - 1)
    out = pl.pallas_call(
        functools.partial(_paged_kernel, page_size=ps, num_pages=n),
        grid=(s, kv),
        in_specs=[pl.BlockSpec((1,), lambda i, j: (i,)),
                  pl.BlockSpec((1, n), lambda i, j: (i, 0)),
                  pl.BlockSpec((1, 1, rows, d), lambda i, j: (i, j, 0, 0)),
                  pl.BlockSpec(k_pages.shape, lambda i, j: (0, 0, 0, 0)),
                  pl.BlockSpec(v_pages.shape, lambda i, j: (0, 0, 0, 0))],
        out_specs=pl.BlockSpec((1, 1, rows, d), lambda i, j: (i, j, 0, 0)),
        out_shape=jax.ShapeDtypeStruct(qh.shape, q.dtype),
        interpret=interpret,
    )(positions, table, qh, k_pages, v_pages)
    return out[:, :, :g].reshape(s, 1, h, d)


IMPLEMENTATIONS = {"xla": gather_attention, "pallas": pallas_attention}
# Backend -> implementation. CPU: Pallas only interprets there (slow), so XLA's gather.
KERNELS = {"cpu": "xla", "gpu": "pallas", "tpu": "pallas"}


def kernel_for(platform: str) -> str:
    return KERNELS.get(platform, "xla")


def paged_attend(k_pages: jax.Array, v_pages: jax.Array, table: jax.Array, positions: jax.Array,
                 active: jax.Array | None, kernel: str = "xla"):
    """Decode attention against one layer's paged cache (the paged `cached_attend`).

    positions [S, 1]: each slot's token is written at offset p % page_size of page
    table[s, p // page_size] (dropped for a slot that is not `active`), then attends to positions
    <= p of its own pages through `table` [S, n] (the live pages; n * page_size bounds p). Index p
    is written before it is read, as in the contiguous cache. Returns an `attend` for
    `decoder_layer` whose aux is the updated (k_pages, v_pages).
    """
    ps, dropped = k_pages.shape[-1], k_pages.shape[0]
    pos = positions[:, 0]

    def attend(q, k, v_new):
        page = jnp.take_along_axis(table, (pos // ps)[:, None], axis=1, mode="clip")[:, 0]
        if active is not None:
            page = jnp.where(active, page, dropped)
        new_k, new_v = write_kv(k_pages, v_pages, k[:, 0], v_new[:, 0], page, pos % ps)
        out = IMPLEMENTATIONS[kernel](q, new_k, new_v, table, pos)
        return out, (new_k, new_v)

    return attend
