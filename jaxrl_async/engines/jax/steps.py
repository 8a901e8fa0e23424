"""The jitted device work of the JAX engine, as pure functions over (model config, weights, cache).

The weights are `inference_weights` (one array per layer) and the cache a per-layer `KVCache`
[S slots, ..., max_len]; both cache-writing steps donate it, so it is updated in place.

- `engine_prefill`: run a packed row [1, T] of prompts through the model and write each token's
  keys/values into its slot at its position. Several prompts share one call (and its weight
  reads); T is a power-of-two bucket, so there is one compilation per bucket, not per length.
- `engine_copy_prefix`: copy the first `length` positions of one slot's cache into another
  (the other samples of a prompt with n > 1 share its prefill).
- `engine_prefill_paged`, `engine_copy_page`: the same for a paged cache (paged_attention.py):
  writes go to (page, offset) pairs the host computed from its page tables; a sample's copy of
  its prompt's partial last page is one page copy. `engine_read_pages` / `engine_write_pages`
  move a preempted sample's pages to the host and back into new pages when it resumes.
- `engine_decode`: feed one token per slot [S] at its position, sample the next token per slot with
  its own parameters, return the updated cache, the tokens and their log-probs.

Padding is harmless by the model's cache contract: a query at position p attends cache indices
j <= p of its row only, and index p is always written (by prefill or by the decode step at p)
before a query at p reads it; stale values past a sequence's position are never read. Packed
padding tokens carry an out-of-range slot, so their writes are dropped.

A paged cache keeps the same contract: a slot's positions live in its pages, and writes of
padding or of a stopped slot go to an out-of-range page and are dropped.

The names carry an `engine_` prefix because jax reports compilations by function name
(`compiles.COMPILE_COUNTS`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from jaxrl_async.engines.jax import sampling
from jaxrl_async.engines.jax.paged_attention import paged_attend
from jaxrl_async.models.attention import KVCache, cached_attend, causal_attend, write_kv
from jaxrl_async.models.config import ModelConfig
from jaxrl_async.models.transformer import forward_layers, inference_logits


def engine_prefill(cfg: ModelConfig, weights: dict, cache: KVCache, tokens: jax.Array,
                   positions: jax.Array, segments: jax.Array, slots: jax.Array) -> KVCache:
    """Prefill packed prompts. tokens/positions/segments [1, T] int32: each prompt is one segment
    with positions 0, 1, ...; slots [T]: the slot each token's keys/values go to (num_slots for
    padding, which is dropped). The logits are not computed."""
    attend = causal_attend(segments)
    _, kvs = forward_layers(cfg, weights, tokens, positions, [attend] * cfg.num_layers, rows=slots[None])
    new = [write_kv(kt, v, k_new[0], v_new[0], slots, positions[0])
           for kt, v, (k_new, v_new) in zip(cache.k, cache.v, kvs, strict=True)]
    return KVCache(k=tuple(kt for kt, _ in new), v=tuple(v for _, v in new))


def engine_prefill_paged(cfg: ModelConfig, weights: dict, cache: KVCache, tokens: jax.Array,
                         positions: jax.Array, segments: jax.Array, pages: jax.Array,
                         offsets: jax.Array) -> KVCache:
    """`engine_prefill` into a paged cache: token t's keys/values go to offset offsets[t] of page
    pages[t] [T] (the number of pages for padding, which is dropped)."""
    attend = causal_attend(segments)
    _, kvs = forward_layers(cfg, weights, tokens, positions, [attend] * cfg.num_layers)
    new = [write_kv(kt, v, k_new[0], v_new[0], pages, offsets)
           for kt, v, (k_new, v_new) in zip(cache.k, cache.v, kvs, strict=True)]
    return KVCache(k=tuple(kt for kt, _ in new), v=tuple(v for _, v in new))


def engine_copy_page(cache: KVCache, src: jax.Array, dst: jax.Array) -> KVCache:
    """Copy page `src` of a paged cache into page `dst`, every layer (a sample's own copy of its
    prompt's partial last page)."""
    return KVCache(k=tuple(kt.at[dst].set(kt[src], mode="drop") for kt in cache.k),
                   v=tuple(v.at[dst].set(v[src], mode="drop") for v in cache.v))


def engine_read_pages(cache: KVCache, pages: jax.Array) -> tuple[tuple[jax.Array, ...], tuple[jax.Array, ...]]:
    """The keys and values of `pages` [M] (every layer) of a paged cache, to keep on the host while
    their sample is preempted. Out-of-range (sentinel) entries read a clamped page: ignore them."""
    return tuple(kt[pages] for kt in cache.k), tuple(v[pages] for v in cache.v)


def engine_write_pages(cache: KVCache, pages: jax.Array, k: tuple, v: tuple) -> KVCache:
    """Write `engine_read_pages`' arrays back into `pages` [M] (a resumed sample's new pages);
    sentinel entries are dropped."""
    return KVCache(k=tuple(kt.at[pages].set(x.astype(kt.dtype), mode="drop") for kt, x in zip(cache.k, k, strict=True)),
                   v=tuple(vt.at[pages].set(x.astype(vt.dtype), mode="drop") for vt, x in zip(cache.v, v, strict=True)))


def engine_copy_prefix(cache: KVCache, src: jax.Array, dst: jax.Array, length: int) -> KVCache:
    """Copy positions [0, length) of slot `src` into slot `dst` (length static: a prompt bucket)."""

    def copy(x: jax.Array, seq_axis: int) -> jax.Array:
        size = list(x.shape)
        size[0], size[seq_axis] = 1, length
        row = jax.lax.dynamic_slice(x, (src, 0, 0, 0), size)
        return jax.lax.dynamic_update_slice(x, row, (dst, 0, 0, 0))

    return KVCache(k=tuple(copy(kt, 3) for kt in cache.k), v=tuple(copy(v, 2) for v in cache.v))


def engine_decode(cfg: ModelConfig, weights: dict, cache: KVCache, tokens: jax.Array,
                  positions: jax.Array, seeds: jax.Array, sample_index: jax.Array,
                  token_index: jax.Array, temperature: jax.Array, top_p: jax.Array, top_k: jax.Array,
                  length: int | None = None, active: jax.Array | None = None,
                  page_table: jax.Array | None = None, kernel: str = "xla"
                  ) -> tuple[KVCache, jax.Array, jax.Array]:
    """One decode step for all S slots (inactive slots compute garbage that nobody reads).

    tokens/positions [S] int32: the token fed to each slot and its position; seeds [S] uint32,
    sample_index/token_index [S] int32 name each slot's random stream; temperature/top_p [S]
    float32, top_k [S] int32. `length` (static): attend over cache indices [0, length) only
    (every position must be < length; None: the whole cache). `active` [S] bool: slots whose
    keys/values are written (None: all). Returns (cache, next tokens [S] int32, log-probs [S]).

    page_table [S, max_len / page_size] int32: the cache is paged (paged_attention.py) and
    `length` (a multiple of the page size) bounds the live pages read; `kernel` (static) names
    the paged attention implementation. None: the contiguous cache.
    """
    if page_table is None:
        writes = positions if active is None else jnp.where(active, positions, cache.v[0].shape[2])
        positions, writes = positions[:, None], writes[:, None]
        attends = [cached_attend(kt, v, positions, length, writes) for kt, v in zip(cache.k, cache.v, strict=True)]
    else:
        live = page_table[:, :length // cache.k[0].shape[-1]]
        positions = positions[:, None]
        attends = [paged_attend(kt, v, live, positions, active, kernel)
                   for kt, v in zip(cache.k, cache.v, strict=True)]
    rows = jnp.arange(tokens.shape[0], dtype=jnp.int32)[:, None]  # row s is slot s
    x, kvs = forward_layers(cfg, weights, tokens[:, None], positions, attends, rows=rows)
    logits = inference_logits(cfg, weights, x)[:, 0]  # [S, V]
    keys = sampling.sample_keys(seeds, sample_index, token_index)
    next_tokens = sampling.sample(logits, keys, temperature, top_p, top_k)
    cache = KVCache(k=tuple(kt for kt, _ in kvs), v=tuple(v for _, v in kvs))
    return cache, next_tokens, sampling.token_logprobs(logits, next_tokens)


@struct.dataclass
class DecodeState:
    """The carry of `engine_decode_steps`' loop: what changes from one decode step to the next."""

    step: jax.Array  # [] int32: decode steps done in this call
    cache: KVCache
    tokens: jax.Array  # [S] int32: the token each slot feeds next
    positions: jax.Array  # [S] int32: its position
    token_index: jax.Array  # [S] int32: index of the token each slot samples next
    remaining: jax.Array  # [S] int32: tokens each slot may still sample; 0: stopped or free
    out_tokens: jax.Array  # [S, k] int32: sampled tokens, valid up to `count`
    out_logprobs: jax.Array  # [S, k] float32
    count: jax.Array  # [S] int32: valid entries per slot


def engine_decode_steps(cfg: ModelConfig, length: int, num_steps: int, weights: dict, cache: KVCache,
                        tokens: jax.Array, positions: jax.Array, seeds: jax.Array,
                        sample_index: jax.Array, token_index: jax.Array, temperature: jax.Array,
                        top_p: jax.Array, top_k: jax.Array, remaining: jax.Array, stop_ids: jax.Array,
                        page_table: jax.Array | None = None, kernel: str = "xla"
                        ) -> tuple[KVCache, jax.Array, jax.Array, jax.Array, jax.Array]:
    """Up to `num_steps` (static) `engine_decode` steps in one call, stopping on device.

    Inputs as `engine_decode`'s, plus remaining [S] int32 (tokens each slot may still sample:
    max_new_tokens minus those generated; 0 for a free slot) and stop_ids [S, M] int32 (each
    slot's stop tokens, padded with -1). A slot stops after sampling a stop token or its last
    allowed token; a stopped slot no longer changes and no longer writes the cache. The loop ends
    early once every slot has stopped. `length` (static) bounds the attention: it must exceed
    every position the call feeds (the largest position + num_steps - 1). page_table / kernel:
    a paged cache, as in `engine_decode` (the table holds a page for every position written).

    Each step draws with key (seed, sample_index, token_index), so k steps in one call sample
    exactly what k one-step calls sample. Returns (cache, tokens [S, k], log-probs [S, k],
    count [S]: valid tokens per slot, steps: decode steps run).
    """
    s = tokens.shape[0]

    def body(st: DecodeState) -> DecodeState:
        active = st.remaining > 0
        cache, new, logprobs = engine_decode(cfg, weights, st.cache, st.tokens, st.positions, seeds,
                                             sample_index, st.token_index, temperature, top_p, top_k,
                                             length, active, page_table, kernel)
        stopped = jnp.any(new[:, None] == stop_ids, axis=-1)
        step = active.astype(jnp.int32)
        return DecodeState(
            step=st.step + 1, cache=cache,
            tokens=jnp.where(active, new, st.tokens), positions=st.positions + step,
            token_index=st.token_index + step,
            remaining=jnp.where(active & ~stopped, st.remaining - 1, 0),
            out_tokens=st.out_tokens.at[:, st.step].set(new),
            out_logprobs=st.out_logprobs.at[:, st.step].set(logprobs),
            count=st.count + step)

    def cond(st: DecodeState) -> jax.Array:
        return (st.step < num_steps) & jnp.any(st.remaining > 0)

    init = DecodeState(step=jnp.int32(0), cache=cache, tokens=tokens, positions=positions,
                       token_index=token_index, remaining=remaining,
                       out_tokens=jnp.zeros((s, num_steps), jnp.int32),
                       out_logprobs=jnp.zeros((s, num_steps), jnp.float32),
                       count=jnp.zeros((s,), jnp.int32))
    st = jax.lax.while_loop(cond, body, init)
    return st.cache, st.out_tokens, st.out_logprobs, st.count, st.step
