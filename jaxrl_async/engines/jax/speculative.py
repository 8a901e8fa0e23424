"""Exact speculative sampling for the JAX engine: draft, verify in one forward pass, accept/reject.

`engine_speculate` is one speculative decode step for every slot of a contiguous cache:

1. draft: up to k tokens per slot, either given (`ngram_draft` / `device_ngram`: the continuation
   of the latest earlier occurrence of the last `ngram` tokens, a point mass q) or drawn by the
   policy's own first N layers (+ final norm + LM head: `draft_layers` = N, self-speculative).
   Layers 0..N-1 of the draft compute exactly what the policy's layers 0..N-1 compute, so the
   draft writes and reads the policy's own KV cache for those layers; the verification below
   rewrites those positions.
2. verify: ONE forward pass of the policy over the k + 1 positions (the slot's last token and
   its drafts), writing their keys/values.
3. accept draft x_j with probability min(1, p_j(x_j) / q_j(x_j)), p_j the target distribution
   after temperature / top-k / top-p exactly as `sampling.sample` builds it; at the first
   rejection draw from normalize(max(p_j - q_j, 0)); when every draft is accepted draw a bonus
   token from p at the next position (q = 0 there, so it is the same rule). The emitted tokens
   are then distributed exactly as plain sampling (Leviathan et al. 2023, Chen et al. 2023).
   Greedy rows (temperature 0) have p = one-hot(argmax): a draft is accepted iff it is the
   argmax. A slot that drafts nothing gets exactly `sampling.sample`'s token (same key, same
   inverse CDF): an undrafted row is plain sampling.

Randomness: token index t of a sample uses the project's key (seed, sample, t)
(`sampling.sample_keys`): the final draw uses it as `sampling.sample` does, the acceptance test
fold_in(key, 1) and the draft model's draw fold_in(key, 2). A uniform that decided nothing
(a position past the first rejection) is drawn again at the next step for a new decision, which
keeps exactness: it is independent of everything emitted.

Log-probs are the policy's raw log-softmax at temperature 1 from the verify logits, for the
emitted tokens. Rejected positions' keys/values stay in the cache past the slot's new position;
the next step writes each position before a query reads it (the cache contract of steps.py), so
they are never read.

`engine_speculate_rounds` runs up to `rounds` such steps in one jitted call, drafting on device
(`device_ngram`, the same rule as the host's `ngram_draft`) and stopping on device, as
`steps.engine_decode_steps` does for plain steps: one host round trip per call.

Deliberate simplifications: a slot's draft length is k or what the n-gram finds (no adaptive k);
the draft model is the policy's own first layers only (a separate smaller model is not
implemented: it would need its own weights, cache and version).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from jaxrl_async.engines.jax import sampling
from jaxrl_async.models.attention import KVCache, cached_attend
from jaxrl_async.models.config import ModelConfig
from jaxrl_async.models.transformer import forward_layers, inference_logits


def ngram_draft(history: list[int], ngram: int, k: int) -> list[int]:
    """The up to k tokens that followed the latest earlier occurrence of history's last `ngram`
    tokens; [] when history is shorter than ngram + 1 or the suffix occurs nowhere earlier."""
    n = len(history)
    if n <= ngram or k <= 0:
        return []
    arr = np.asarray(history)
    suffix = arr[n - ngram:]
    # Every start before the suffix's own (it may overlap the suffix): each has a continuation.
    windows = np.lib.stride_tricks.sliding_window_view(arr[:n - 1], ngram)  # starts 0 .. n-1-ngram
    hits = np.flatnonzero(np.all(windows == suffix, axis=1))
    if not hits.size:
        return []
    start = int(hits[-1]) + ngram
    return [int(x) for x in arr[start:start + k]]


def parse_draft_model(spec: str, num_layers: int) -> int:
    """`engine.speculation.draft_model` "layers:N" -> N (1 <= N < the policy's layers)."""
    key = "engine.speculation.draft_model"
    name, _, n = spec.partition(":")
    if name != "layers" or not n.isdigit():
        raise ValueError(f"{key}={spec!r}: the JAX engine drafts with the policy's own first layers only: "
                         f"use layers:N (a separate draft model is not implemented)")
    if not 1 <= int(n) < num_layers:
        raise ValueError(f"{key}={spec!r}: N must be in [1, {num_layers - 1}] (the policy has {num_layers} layers)")
    return int(n)


def target_probs(logits: jax.Array, temperature: jax.Array, top_p: jax.Array, top_k: jax.Array) -> jax.Array:
    """The distribution `sampling.sample` draws from: [N, V] float32 logits -> [N, V] probabilities.

    Greedy rows (temperature <= 0) are one-hot at the argmax of the raw logits."""
    greedy = temperature <= 0
    scaled = logits / jnp.where(greedy, 1.0, temperature)[:, None]
    needs_truncation = (~greedy) & ((top_p < 1.0) | (top_k > 0))
    scaled = jax.lax.cond(jnp.any(needs_truncation),
                          lambda x: sampling._truncate(x, top_p, top_k), lambda x: x, scaled)
    onehot = jax.nn.one_hot(jnp.argmax(logits, axis=-1), logits.shape[-1], dtype=jnp.float32)
    return jnp.where(greedy[:, None], onehot, jax.nn.softmax(scaled, axis=-1))


def draw(weights: jax.Array, keys: jax.Array) -> jax.Array:
    """One token per row from unnormalised non-negative weights [N, V], by `sampling.sample`'s
    inverse CDF (u in (0, 1], the first index whose cdf reaches u * total)."""
    cdf = jnp.cumsum(weights, axis=-1)
    u = 1.0 - jax.vmap(jax.random.uniform)(keys)
    return jnp.sum(cdf < (u * cdf[:, -1])[:, None], axis=-1).astype(jnp.int32)


def accepts(u: jax.Array, p_x: jax.Array, q_x: jax.Array) -> jax.Array:
    """The acceptance test of a draft x: u ~ U[0, 1) < p(x) / q(x), as u * q(x) < p(x) (no
    division; p(x) >= q(x) always accepts)."""
    return u * q_x < p_x


def _flat(x: jax.Array) -> jax.Array:
    return x.reshape(-1, *x.shape[2:])


def _draft_with_layers(cfg: ModelConfig, n_layers: int, k: int, weights: dict, cache: KVCache,
                       tokens, positions, n_draft, keys, temperature, top_p, top_k, drop: int):
    """k autoregressive draws of the first `n_layers` layers, writing their KV into the policy's
    cache rows of those layers. Returns (cache, drafts [S, k], q [S, k, V])."""
    draft_weights = {**weights, "layers": tuple(weights["layers"][:n_layers])}
    k_cache, v_cache = list(cache.k), list(cache.v)
    token, drafts, qs = tokens, [], []
    for i in range(k):  # k is small and static: unrolled
        writes = jnp.where(i < n_draft, positions + i, drop)[:, None]
        attends = [cached_attend(kt, v, (positions + i)[:, None], None, writes)
                   for kt, v in zip(k_cache[:n_layers], v_cache[:n_layers], strict=True)]
        x, kvs = forward_layers(cfg, draft_weights, token[:, None], (positions + i)[:, None], attends)
        for layer, (kt, v) in enumerate(kvs):
            k_cache[layer], v_cache[layer] = kt, v
        q = target_probs(inference_logits(cfg, weights, x)[:, 0], temperature, top_p, top_k)
        token = draw(q, jax.vmap(lambda key: jax.random.fold_in(key, 2))(keys[:, i]))
        drafts.append(token)
        qs.append(q)
    return KVCache(k=tuple(k_cache), v=tuple(v_cache)), jnp.stack(drafts, 1), jnp.stack(qs, 1)


def engine_speculate(cfg: ModelConfig, length: int, k: int, draft_layers: int, weights: dict,
                     cache: KVCache, tokens: jax.Array, positions: jax.Array, drafts: jax.Array,
                     n_draft: jax.Array, seeds: jax.Array, sample_index: jax.Array,
                     token_index: jax.Array, temperature: jax.Array, top_p: jax.Array,
                     top_k: jax.Array, remaining: jax.Array, stop_ids: jax.Array):
    """One speculative decode step for all S slots (see the module docstring).

    tokens/positions [S]: each slot's last token and its position; drafts [S, k] int32 the
    host's drafts (ignored when draft_layers > 0: the first draft_layers layers draw them),
    n_draft [S] the drafts to verify per slot (0: plain sampling; <= remaining - 1);
    remaining [S] tokens each slot may still emit (0: free or stopped, no cache writes);
    stop_ids [S, M] each slot's stop tokens padded with -1; the rest as `steps.engine_decode`.
    `length` (static) must exceed every position fed (position + k), or be the cache's length.

    Returns (cache, tokens [S, k + 1], log-probs [S, k + 1], count [S]: valid entries, cut at
    a stop token and at remaining; accepted [S]: drafts kept).
    """
    s, drop = tokens.shape[0], cache.v[0].shape[2]
    active = remaining > 0
    n_draft = jnp.where(active, jnp.minimum(n_draft, remaining - 1), 0)
    offsets = jnp.arange(k + 1)
    keys = sampling.sample_keys(jnp.repeat(seeds, k + 1), jnp.repeat(sample_index, k + 1),
                                (token_index[:, None] + offsets[None]).reshape(-1)).reshape(s, k + 1)
    if draft_layers:
        cache, drafts, q = _draft_with_layers(cfg, draft_layers, k, weights, cache, tokens, positions,
                                              n_draft, keys, temperature, top_p, top_k, drop)
    else:
        q = jax.nn.one_hot(drafts, cfg.vocab_size, dtype=jnp.float32)  # [S, k, V]: point masses
    q = jnp.where((jnp.arange(k)[None] < n_draft[:, None])[..., None], q, 0.0)
    q = jnp.concatenate([q, jnp.zeros((s, 1, q.shape[-1]), q.dtype)], axis=1)  # [S, k+1, V]: bonus q = 0

    fed = jnp.concatenate([tokens[:, None], drafts], axis=1)  # [S, k+1]
    pos = positions[:, None] + offsets[None]
    writes = jnp.where(active[:, None], pos, drop)
    attends = [cached_attend(kt, v, pos, length, writes) for kt, v in zip(cache.k, cache.v, strict=True)]
    x, kvs = forward_layers(cfg, weights, fed, pos, attends)
    logits = inference_logits(cfg, weights, x)  # [S, k+1, V] float32
    rep = lambda a: jnp.repeat(a, k + 1)  # noqa: E731 - per-row parameters, per position
    p = target_probs(_flat(logits), rep(temperature), rep(top_p), rep(top_k)).reshape(logits.shape)

    # Accept draft j (j < n_draft) with probability min(1, p(x) / q(x)).
    p_x = jnp.take_along_axis(p[:, :k], drafts[..., None], axis=-1)[..., 0]  # [S, k]
    q_x = jnp.take_along_axis(q[:, :k], drafts[..., None], axis=-1)[..., 0]
    u = jax.vmap(jax.vmap(lambda key: jax.random.uniform(jax.random.fold_in(key, 1))))(keys[:, :k])
    ok = accepts(u, p_x, q_x) & (jnp.arange(k)[None] < n_draft[:, None])
    accepted = jnp.sum(jnp.cumprod(ok.astype(jnp.int32), axis=1), axis=1)  # [S]

    # The token after the accepted run: from max(p - q, 0) (q = 0 past the drafts: p itself).
    p_a = jnp.take_along_axis(p, accepted[:, None, None], axis=1)[:, 0]  # [S, V]
    q_a = jnp.take_along_axis(q, accepted[:, None, None], axis=1)[:, 0]
    residual = jnp.maximum(p_a - q_a, 0.0)
    residual = jnp.where(jnp.sum(residual, -1, keepdims=True) > 0, residual, p_a)  # p == q: never drawn
    last = draw(residual, keys[jnp.arange(s), accepted])
    out = jnp.where(offsets[None] < accepted[:, None], jnp.concatenate([drafts, drafts[:, :1]], 1),
                    last[:, None])  # [S, k+1]; entries past `accepted` are cut by count below
    logprobs = sampling.token_logprobs(_flat(logits), out.reshape(-1)).reshape(s, k + 1)

    is_stop = jnp.any(out[..., None] == stop_ids[:, None, :], axis=-1)  # [S, k+1]
    first_stop = jnp.argmax(is_stop, axis=1) + 1
    count = jnp.minimum(accepted + 1, remaining)
    count = jnp.where(jnp.any(is_stop & (offsets[None] < count[:, None]), axis=1), first_stop, count)
    count = jnp.where(active, count, 0)
    new_cache = KVCache(k=tuple(kt for kt, _ in kvs), v=tuple(v for _, v in kvs))
    return new_cache, out, logprobs, count, jnp.where(active, jnp.minimum(accepted, count), 0)


def device_ngram(history: jax.Array, hist_len: jax.Array, ngram: int, k: int) -> tuple[jax.Array, jax.Array]:
    """`ngram_draft` on device for every row: history [S, H] int32 (valid up to hist_len [S]) ->
    (drafts [S, k] int32, their count [S])."""
    h = history.shape[1]
    idx = jnp.arange(h)
    suffix = jnp.take_along_axis(history, jnp.clip(hist_len[:, None] - ngram + jnp.arange(ngram), 0, h - 1), 1)
    match = (idx[None] <= hist_len[:, None] - ngram - 1) & (hist_len[:, None] > ngram)  # starts before the suffix's
    for j in range(ngram):
        match &= jnp.roll(history, -j, axis=1) == suffix[:, j:j + 1]
    last = jnp.max(jnp.where(match, idx[None], -1), axis=1)
    start = last + ngram
    drafts = jnp.take_along_axis(history, jnp.clip(start[:, None] + jnp.arange(k), 0, h - 1), 1)
    return drafts, jnp.where(last >= 0, jnp.minimum(k, hist_len - start), 0).astype(jnp.int32)


@struct.dataclass
class RoundState:
    """The carry of `engine_speculate_rounds`' loop."""

    round: jax.Array  # [] int32: verify passes done in this call
    cache: KVCache
    tokens: jax.Array  # [S] int32: the token each slot feeds next
    positions: jax.Array  # [S] int32
    token_index: jax.Array  # [S] int32
    remaining: jax.Array  # [S] int32: 0 once stopped
    history: jax.Array  # [S, H] int32: prompt + tokens so far (the n-gram draft's text)
    hist_len: jax.Array  # [S] int32
    out_tokens: jax.Array  # [S, rounds * (k + 1)] int32, valid up to `count`
    out_logprobs: jax.Array  # [S, rounds * (k + 1)] float32
    count: jax.Array  # [S] int32
    drafted: jax.Array  # [S] int32: drafts verified
    accepted: jax.Array  # [S] int32: drafts kept


def engine_speculate_rounds(cfg: ModelConfig, length: int, k: int, draft_layers: int, rounds: int, ngram: int,
                            weights: dict, cache: KVCache, tokens: jax.Array, positions: jax.Array,
                            history: jax.Array, hist_len: jax.Array, speculating: jax.Array, seeds: jax.Array,
                            sample_index: jax.Array, token_index: jax.Array, temperature: jax.Array,
                            top_p: jax.Array, top_k: jax.Array, remaining: jax.Array, stop_ids: jax.Array):
    """Up to `rounds` (static) `engine_speculate` steps in one call, drafting on device, stopping
    on device (as `steps.engine_decode_steps` does for plain steps: one host round trip a call).

    Rows with `speculating` [S] bool draft: the first `draft_layers` layers when > 0, else the
    n-gram draft of length `ngram` over history [S, H] (valid up to hist_len [S]; H >= the
    longest prompt + max_new_tokens); the others verify no draft (plain sampling). `length`
    must exceed every position fed (position + rounds * (k + 1)), or be the cache's length.
    Returns (cache, tokens [S, rounds * (k + 1)], log-probs, count [S], drafted [S], accepted [S],
    verify passes run).
    """
    s, width = tokens.shape[0], rounds * (k + 1)
    rows = jnp.arange(s)[:, None]

    def body(st: RoundState) -> RoundState:
        if draft_layers:
            drafts, n_draft = jnp.zeros((s, k), jnp.int32), jnp.full((s,), k, jnp.int32)
        else:
            drafts, n_draft = device_ngram(st.history, st.hist_len, ngram, k)
        n_draft = jnp.where(speculating & (st.remaining > 0), jnp.minimum(n_draft, st.remaining - 1), 0)
        cache, out, logprobs, count, accepted = engine_speculate(
            cfg, length, k, draft_layers, weights, st.cache, st.tokens, st.positions, drafts, n_draft, seeds,
            sample_index, st.token_index, temperature, top_p, top_k, st.remaining, stop_ids)
        cols = st.count[:, None] + jnp.arange(k + 1)[None]  # entries past `count` are overwritten or ignored
        stopped = jnp.any((out[..., None] == stop_ids[:, None, :]).any(-1) & (jnp.arange(k + 1)[None] < count[:, None]),
                          axis=1)
        last = jnp.take_along_axis(out, jnp.maximum(count - 1, 0)[:, None], 1)[:, 0]
        return RoundState(
            round=st.round + 1, cache=cache, tokens=jnp.where(count > 0, last, st.tokens),
            positions=st.positions + count, token_index=st.token_index + count,
            remaining=jnp.where(stopped, 0, st.remaining - count),
            history=st.history.at[rows, st.hist_len[:, None] + jnp.arange(k + 1)[None]].set(out, mode="drop"),
            hist_len=st.hist_len + count,
            out_tokens=st.out_tokens.at[rows, cols].set(out, mode="drop"),
            out_logprobs=st.out_logprobs.at[rows, cols].set(logprobs, mode="drop"),
            count=st.count + count, drafted=st.drafted + n_draft, accepted=st.accepted + accepted)

    def cond(st: RoundState) -> jax.Array:
        return (st.round < rounds) & jnp.any(st.remaining > 0)

    zeros = jnp.zeros((s,), jnp.int32)
    init = RoundState(round=jnp.int32(0), cache=cache, tokens=tokens, positions=positions, token_index=token_index,
                      remaining=remaining, history=history, hist_len=hist_len,
                      out_tokens=jnp.zeros((s, width), jnp.int32), out_logprobs=jnp.zeros((s, width), jnp.float32),
                      count=zeros, drafted=zeros, accepted=zeros)
    st = jax.lax.while_loop(cond, body, init)
    return st.cache, st.out_tokens, st.out_logprobs, st.count, st.drafted, st.accepted, st.round
