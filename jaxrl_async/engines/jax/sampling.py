"""Per-slot token sampling: temperature, top-p, top-k and greedy in one batched function.

Every slot carries its own sampling parameters as arrays, so one compiled decode step serves
any mix of requests. Randomness is derived from (seed, sample index, token index) alone, so a
sample is reproducible whatever slot or batch it runs in.

Costs (measured on CPU, 32 rows x 49k vocab): a draw is by inverse CDF — one uniform per row
against the cumulative softmax, ~6x cheaper than Gumbel-max's one random number per vocabulary
entry; the float32 cumsum moves a token's probability by about 1e-7 at most. A step whose rows
are all greedy skips drawing; the full-vocabulary sort behind top-p/top-k runs only in steps
where some row asks for them (it is the most expensive part by far).

Deliberate simplification: tokens tied with the last kept logit of top-p/top-k are kept too
(the kept set can be a little larger than k).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def sample_keys(seeds: jax.Array, sample_index: jax.Array, token_index: jax.Array) -> jax.Array:
    """One PRNG key per slot from uint32 seeds [S], sample indices [S] and token indices [S]."""

    def one(seed, i, t):
        return jax.random.fold_in(jax.random.fold_in(jax.random.key(seed), i), t)

    return jax.vmap(one)(seeds, sample_index, token_index)


def _truncate(scaled: jax.Array, top_p: jax.Array, top_k: jax.Array) -> jax.Array:
    """Set logits outside each row's top-k / nucleus-top_p set to -inf. scaled: [S, V]."""
    desc = -jnp.sort(-scaled, axis=-1)  # [S, V], most likely first
    probs = jax.nn.softmax(desc, axis=-1)
    mass_before = jnp.cumsum(probs, axis=-1) - probs
    rank = jnp.arange(scaled.shape[-1])[None, :]
    # Both conditions keep a prefix of the sorted row, and always its first entry (top_p > 0).
    keep_p = (top_p[:, None] >= 1.0) | (mass_before < top_p[:, None])  # rounding can't drop tails
    keep = keep_p & ((top_k[:, None] <= 0) | (rank < top_k[:, None]))
    n_keep = jnp.sum(keep, axis=-1)  # [S], >= 1
    threshold = jnp.take_along_axis(desc, (n_keep - 1)[:, None], axis=-1)  # [S, 1]
    return jnp.where(scaled >= threshold, scaled, -jnp.inf)


def sample(logits: jax.Array, keys: jax.Array, temperature: jax.Array, top_p: jax.Array,
           top_k: jax.Array) -> jax.Array:
    """Draw one token per row. logits [S, V] float32; temperature/top_p [S]; top_k [S] int32.

    temperature 0 is greedy: argmax of the raw logits, ignoring top-p/top-k.
    """
    greedy = temperature <= 0
    argmax = jnp.argmax(logits, axis=-1).astype(jnp.int32)

    def draw(logits):
        scaled = logits / jnp.where(greedy, 1.0, temperature)[:, None]
        needs_truncation = (~greedy) & ((top_p < 1.0) | (top_k > 0))
        scaled = jax.lax.cond(jnp.any(needs_truncation),
                              lambda x: _truncate(x, top_p, top_k), lambda x: x, scaled)
        cdf = jnp.cumsum(jax.nn.softmax(scaled, axis=-1), axis=-1)  # [S, V]
        # u in (0, 1]: the chosen index is the first whose cdf reaches u * total, and that
        # token has positive probability (a flat cdf step is never the first to reach it).
        u = 1.0 - jax.vmap(jax.random.uniform)(keys)
        drawn = jnp.sum(cdf < (u * cdf[:, -1])[:, None], axis=-1).astype(jnp.int32)
        return jnp.where(greedy, argmax, drawn)

    return jax.lax.cond(jnp.all(greedy), lambda x: argmax, draw, logits)


def token_logprobs(logits: jax.Array, tokens: jax.Array) -> jax.Array:
    """log_softmax(raw logits)[token] per row: the behaviour policy's log-prob at temperature 1.

    As logit[token] - logsumexp(logits), without materialising the [S, V] log-softmax."""
    logits = logits.astype(jnp.float32)
    chosen = jnp.take_along_axis(logits, tokens[:, None], axis=-1)[:, 0]
    return chosen - jax.nn.logsumexp(logits, axis=-1)
