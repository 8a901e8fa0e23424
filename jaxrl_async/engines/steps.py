"""The jitted device work of the JAX engine, as pure functions over (graphdef, params, rest).

- `engine_prefill`: run a right-padded prompt bucket [1, T] through the model into a fresh [L, 1, T]
  cache. T is a power-of-two bucket, so there is one compilation per bucket, not per length.
- `engine_write_prefix`: copy that prefix into one slot row of the engine cache (donated, in place).
- `engine_decode`: feed one token per slot [S] at its position, sample the next token per slot with
  its own parameters, return the updated cache (donated), the tokens and their log-probs.

Padding is harmless by the model's cache contract: a query at position p attends cache indices
j <= p of its row only, and index p is always written (by prefill or by the decode step at p)
before a query at p reads it; stale values past a sequence's position are never read.

The names carry an `engine_` prefix because jax reports compilations by function name
(`core.COMPILE_COUNTS`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from jaxrl_async.engines import sampling
from jaxrl_async.models.config import ModelConfig
from jaxrl_async.models.transformer import KVCache, init_cache


def engine_prefill(graphdef: nnx.GraphDef, cfg: ModelConfig, cache_dtype: str, params: nnx.State,
            rest: nnx.State, tokens: jax.Array) -> KVCache:
    """tokens [1, T] int32 (right padded) -> their keys/values, a KVCache [L, 1, T, Hkv, D]."""
    model = nnx.merge(graphdef, params, rest)
    t = tokens.shape[1]
    positions = jnp.arange(t, dtype=jnp.int32)[None, :]
    # The logits are unused; XLA drops the LM head from the compiled program.
    _, prefix = model(tokens, positions, cache=init_cache(cfg, 1, t, cache_dtype))
    return prefix


def engine_write_prefix(cache: KVCache, prefix: KVCache, slot: jax.Array) -> KVCache:
    """Write prefix [L, 1, T, ...] at positions [0, T) of row `slot` of cache [L, S, max_len, ...]."""
    start = (0, slot, 0, 0, 0)
    return KVCache(k=jax.lax.dynamic_update_slice(cache.k, prefix.k, start),
                   v=jax.lax.dynamic_update_slice(cache.v, prefix.v, start))


def engine_decode(graphdef: nnx.GraphDef, params: nnx.State, rest: nnx.State, cache: KVCache,
           tokens: jax.Array, positions: jax.Array, seeds: jax.Array, sample_index: jax.Array,
           token_index: jax.Array, temperature: jax.Array, top_p: jax.Array, top_k: jax.Array
           ) -> tuple[KVCache, jax.Array, jax.Array]:
    """One decode step for all S slots (free slots compute garbage that nobody reads).

    tokens/positions [S] int32: the token fed to each slot and its position; seeds [S] uint32,
    sample_index/token_index [S] int32 name each slot's random stream; temperature/top_p [S]
    float32, top_k [S] int32. Returns (cache, next tokens [S] int32, their log-probs [S]).
    """
    model = nnx.merge(graphdef, params, rest)
    logits, cache = model(tokens[:, None], positions[:, None], cache=cache)
    logits = logits[:, 0]  # [S, V]
    keys = sampling.sample_keys(seeds, sample_index, token_index)
    next_tokens = sampling.sample(logits, keys, temperature, top_p, top_k)
    return cache, next_tokens, sampling.token_logprobs(logits, next_tokens)
