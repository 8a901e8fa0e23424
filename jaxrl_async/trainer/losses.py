"""GRPO-family policy losses: pure array functions, each piece registered by name.

A loss is assembled from three registered pieces, chosen by `LossConfig`:

- `ADVANTAGES[name](rewards, group_ids, eps) -> [N]`: group-relative advantages.
  `grpo` = (r - mean_g) / (std_g + eps) (DeepSeekMath, Shao et al. 2024; std is the sample std,
  as TRL and verl compute it); `drgrpo` = r - mean_g, no std division (Dr. GRPO, Liu et al. 2025,
  "Understanding R1-Zero-Like Training": the std term up-weights too-easy/too-hard prompts).
- `AGGREGATIONS[name](loss_mask, norm_len) -> [N, T]`: per-token weights whose weighted sum of the
  per-token loss is the batch loss. `seq_mean` = 1 / (N_seq * |o_i|) (GRPO: mean over a
  sequence's tokens, then over sequences); `token_mean` = 1 / sum(mask) (DAPO, Yu et al. 2025:
  every token counts the same, so long answers are not down-weighted); `drgrpo` = 1 / (N_seq *
  norm_len) (Dr. GRPO: a constant normalizer removes the length bias of `seq_mean`).
  Expressing the aggregation as weights computed on the *whole* batch is what makes gradient
  accumulation exact: a micro-batch's loss is the weighted sum over its rows, and the sum over
  micro-batches is the full-batch loss.
- `OFF_POLICY[name](logprobs, behaviour_logprobs, cfg) -> (old_logprobs, is_weight)`: which policy
  the PPO ratio is taken against, and the (stop-gradient) importance weight on each token.
  Notation: pi = current policy (with gradient), pi_prox = proximal policy, mu = behaviour policy
  (the engine's log-probs recorded at generation, `TrainBatch.behaviour_logprobs`).
  * `none`: ratio pi / mu, weight 1. Plain PPO/GRPO that treats the behaviour policy as pi_old; in
    an async run the clip then bounds the move away from the (stale) generation policy.
  * `tis`: truncated importance sampling (Yao et al. 2025, "Your Efficient RL Framework Secretly
    Brings You Off-Policy RL Training"): ratio pi / pi_prox, weight min(pi_prox / mu, C),
    C = `tis_cap`. Corrects both the engine/trainer numerics mismatch and staleness.
  * `decoupled`: decoupled PPO objective (Hilton et al. 2022, "Batch size-invariance for policy
    optimization"; AReaL, Fu et al. 2025): ratio pi / pi_prox clipped, weight pi_prox / mu, not
    truncated; tokens whose weight exceeds `decoupled_is_cap` (when set) are masked out, as
    AReaL's `behav_imp_weight_cap` does.
  * `cispo`: CISPO (MiniMax-M1, 2025): weight sg(clip(pi_prox / mu, 1 - eps_low_IS, 1 + eps_high_IS))
    on every token's grad log pi, no PPO clip, so every token keeps a gradient (the PPO clip's
    zero-gradient region is what CISPO removes). `cispo_eps_low=None` imposes no lower bound, as
    MiniMax-M1 does. With one update per batch (below) the ratio is 1, the PPO clip is never
    active, and CISPO equals `tis` with cap 1 + eps_high_IS plus an optional floor: the two
    differ only in trainers that make several updates per batch.
  * `m2po`: M2PO (Zheng et al. 2025, "Prosperity before Collapse"; AReaL's implementation):
    weight pi_prox / mu, untruncated, on the tokens that survive a second-moment trust region:
    over the whole batch, M2 = mean of (log pi_prox / mu)^2 over the loss tokens; while M2 >
    `m2_threshold`, the tokens with the largest squared log-ratio are masked (sorted ascending,
    the longest prefix whose mean is <= the threshold is kept; equal values at the cut-off are
    kept or masked together). Masked tokens keep their place in the normalizer (footnote 2 of
    the paper). The mask is a whole-batch statistic: `m2po_cutoff` computes it, and the train
    step runs one no-grad forward of every micro-batch first when a step has several.
  What we implement for pi_prox: the trainer makes exactly ONE optimizer update per batch (the
  micro-batches of gradient accumulation all see the pre-step weights), so the pre-step policy
  *is* the current parameters at loss time, and pi_prox = stop_gradient(pi) is the exact proximal
  policy, not an approximation; it costs no extra forward pass. Its ratio is 1 in value (so the
  clip is never active in `tis`/`decoupled` with one update per batch) and its gradient is
  grad log pi, so both reduce to an importance-weighted policy gradient whose weight is
  computed against the trainer's own forward. A trainer doing several updates per batch would
  need a separate proximal forward before the first update; this one does not.

Per-token objective (to minimise), with A the sequence's advantage, r the ratio, w the weight:
    l = -w * min(r A, clip(r, 1 - eps_low, 1 + eps_high) A) + kl_coef * k3(pi, pi_ref)
with asymmetric clipping from DAPO ("clip-higher") and the k3 KL estimator
k3 = exp(ref - logp) - (ref - logp) - 1 (Schulman 2020, as in GRPO).

To add a piece: write a function with the signature above and decorate it with the registry's
`register_*`; `LossConfig` validates names against the registries themselves.
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp

from jaxrl_async.trainer.config import LossConfig

ADVANTAGES: dict[str, Callable] = {}
AGGREGATIONS: dict[str, Callable] = {}
OFF_POLICY: dict[str, Callable] = {}

# Metrics that combine across micro-batches by max; every other metric is a weighted sum whose
# weights are normalized over the whole batch, so micro-batch values add up.
MAX_METRICS = ("ratio_max", "is_weight_max")


def _registrar(registry: dict[str, Callable], kind: str):
    def register(name: str):
        def deco(fn: Callable) -> Callable:
            if name in registry:
                raise ValueError(f"{kind} '{name}' registered twice")
            registry[name] = fn
            return fn
        return deco
    return register


register_advantage = _registrar(ADVANTAGES, "advantage")
register_aggregation = _registrar(AGGREGATIONS, "aggregation")
register_off_policy = _registrar(OFF_POLICY, "off_policy")


# ---------------------------------------------------------------- advantages


def _group_stats(rewards: jax.Array, group_ids: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Per-row (group mean, group sample std, valid). Rows with group_id < 0 are padding.

    An [N, N] same-group matrix instead of segment sums: group ids may be any non-negative ints
    (uids), and N (a few thousand at most) keeps it cheap.
    """
    valid = group_ids >= 0
    same = (group_ids[:, None] == group_ids[None, :]) & valid[:, None] & valid[None, :]
    same = same.astype(jnp.float32)
    count = jnp.maximum(same.sum(-1), 1.0)
    mean = same @ rewards / count
    sq = same @ jnp.square(rewards) - count * jnp.square(mean)
    std = jnp.sqrt(jnp.maximum(sq, 0.0) / jnp.maximum(count - 1.0, 1.0))
    return mean, std, valid


@register_advantage("grpo")
def grpo_advantages(rewards: jax.Array, group_ids: jax.Array, eps: float) -> jax.Array:
    mean, std, valid = _group_stats(rewards, group_ids)
    return jnp.where(valid, (rewards - mean) / (std + eps), 0.0)


@register_advantage("drgrpo")
def drgrpo_advantages(rewards: jax.Array, group_ids: jax.Array, eps: float) -> jax.Array:
    del eps  # Dr. GRPO drops the std division, hence the epsilon that guards it
    mean, _, valid = _group_stats(rewards, group_ids)
    return jnp.where(valid, rewards - mean, 0.0)


# ---------------------------------------------------------------- aggregations


def _num_sequences(loss_mask: jax.Array) -> tuple[jax.Array, jax.Array]:
    per_seq = loss_mask.sum(-1)  # [N]
    return per_seq, jnp.maximum((per_seq > 0).sum(), 1)


@register_aggregation("seq_mean")
def seq_mean_weights(loss_mask: jax.Array, norm_len: int | None) -> jax.Array:
    per_seq, n_seq = _num_sequences(loss_mask)
    return loss_mask / (jnp.maximum(per_seq, 1.0)[:, None] * n_seq)


@register_aggregation("token_mean")
def token_mean_weights(loss_mask: jax.Array, norm_len: int | None) -> jax.Array:
    return loss_mask / jnp.maximum(loss_mask.sum(), 1.0)


@register_aggregation("drgrpo")
def drgrpo_weights(loss_mask: jax.Array, norm_len: int | None) -> jax.Array:
    _, n_seq = _num_sequences(loss_mask)
    return loss_mask / (n_seq * float(norm_len))


# ---------------------------------------------------------------- off-policy corrections


@register_off_policy("none")
def behaviour_as_old(logprobs: jax.Array, behaviour_logprobs: jax.Array, cfg: LossConfig):
    return behaviour_logprobs, jnp.ones_like(logprobs)


@register_off_policy("tis")
def truncated_importance_sampling(logprobs: jax.Array, behaviour_logprobs: jax.Array, cfg: LossConfig):
    prox = jax.lax.stop_gradient(logprobs)
    return prox, jnp.minimum(jnp.exp(prox - behaviour_logprobs), cfg.tis_cap)


@register_off_policy("decoupled")
def decoupled_ppo(logprobs: jax.Array, behaviour_logprobs: jax.Array, cfg: LossConfig):
    prox = jax.lax.stop_gradient(logprobs)
    weight = jnp.exp(prox - behaviour_logprobs)
    if cfg.decoupled_is_cap is not None:
        weight = jnp.where(weight > cfg.decoupled_is_cap, 0.0, weight)
    return prox, weight


@register_off_policy("cispo")
def clipped_is_policy_optimization(logprobs: jax.Array, behaviour_logprobs: jax.Array, cfg: LossConfig):
    prox = jax.lax.stop_gradient(logprobs)
    low = 0.0 if cfg.cispo_eps_low is None else 1.0 - cfg.cispo_eps_low
    return prox, jnp.clip(jnp.exp(prox - behaviour_logprobs), low, 1.0 + cfg.cispo_eps_high)


@register_off_policy("m2po")
def second_moment_trust(logprobs: jax.Array, behaviour_logprobs: jax.Array, cfg: LossConfig):
    """The weight only; `policy_loss` applies the second-moment mask (a whole-batch statistic)."""
    prox = jax.lax.stop_gradient(logprobs)
    return prox, jnp.exp(prox - behaviour_logprobs)


def m2po_cutoff(log_ratio: jax.Array, mask: jax.Array, threshold: float) -> jax.Array:
    """M2PO's trust region as a cut-off c: a token is kept iff (log pi_prox/mu)^2 <= c.

    Over the tokens where `mask` holds (any shape): sort the squared log-ratios ascending and keep
    the longest prefix whose mean is <= `threshold` (prefix means of sorted values never
    decrease, so that prefix is a count); c is the last kept value, +inf when every token is
    kept, -1 when none is.
    """
    sq = jnp.where(mask, jnp.square(log_ratio), jnp.inf).reshape(-1)
    ordered = jnp.sort(sq)  # the masked-out (+inf) come last
    n_valid = jnp.sum(mask)
    counts = jnp.arange(1, ordered.size + 1, dtype=jnp.float32)
    prefix_mean = jnp.cumsum(jnp.where(jnp.isfinite(ordered), ordered, 0.0)) / counts
    keep = jnp.sum((prefix_mean <= threshold) & (counts <= n_valid))
    last_kept = ordered[jnp.maximum(keep - 1, 0)]
    return jnp.where(keep >= n_valid, jnp.inf, jnp.where(keep == 0, -1.0, last_kept))


def m2po_trusted(log_ratio: jax.Array, mask: jax.Array, threshold: float) -> jax.Array:
    """M2PO's trust region as a per-token mask (same shape as `log_ratio`): the tokens whose
    squared log-ratio is within `m2po_cutoff`. The train step computes it once, from one forward,
    and hands the mask (not the cut-off) to each micro-batch: the last kept token's log-ratio,
    recomputed by the gradient's own forward (another XLA program: chunked, rematerialized), can
    differ from the value the cut-off was taken from by an ulp and fall outside it."""
    return jnp.square(log_ratio) <= m2po_cutoff(log_ratio, mask, threshold)


# ---------------------------------------------------------------- the loss


def batch_terms(loss_mask: jax.Array, rewards: jax.Array, group_ids: jax.Array,
                cfg: LossConfig) -> dict[str, jax.Array]:
    """Whole-batch quantities `policy_loss` needs: compute them before splitting micro-batches,
    since group statistics and normalizers span the batch.

    Returns advantages [N], weights [N, T] (aggregation) and metric_weights [N, T] (token mean).
    """
    mask = loss_mask.astype(jnp.float32)
    return {
        "advantages": ADVANTAGES[cfg.advantage](rewards.astype(jnp.float32), group_ids, cfg.adv_eps),
        "weights": AGGREGATIONS[cfg.aggregation](mask, cfg.norm_len),
        "metric_weights": mask / jnp.maximum(mask.sum(), 1.0),
    }


def policy_loss(
    logprobs: jax.Array,  # [N, T] f32, log pi(token_t | tokens_<t), differentiable
    *,
    behaviour_logprobs: jax.Array,  # [N, T] f32, mu at generation (0 where masked)
    advantages: jax.Array,  # [N] f32
    weights: jax.Array,  # [N, T] aggregation weights from `batch_terms` (0 off the mask)
    metric_weights: jax.Array,  # [N, T] loss_mask / total masked tokens of the whole batch
    cfg: LossConfig,
    ref_logprobs: jax.Array | None = None,  # [N, T] f32, needed when cfg.kl_coef > 0
    entropy: jax.Array | None = None,  # [N, T] f32 per-token entropy, only reported
    m2_trusted: jax.Array | None = None,  # [N, T] bool: the whole batch's `m2po_trusted` (m2po on a micro-batch)
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Scalar loss and metrics for (a micro-batch of) a batch; see the module docstring.

    Weights carry the whole batch's normalization, so on a micro-batch the result is that
    micro-batch's share: summing losses (and non-max metrics) over micro-batches gives the
    full-batch values.
    """
    mask = metric_weights > 0
    # Masked positions are forced to 0 log-prob differences so that exp() stays finite there.
    logprobs_m = jnp.where(mask, logprobs, 0.0)
    behaviour = jnp.where(mask, behaviour_logprobs, 0.0)
    old, is_weight = OFF_POLICY[cfg.off_policy](logprobs_m, behaviour, cfg)
    extra = {}
    if cfg.off_policy == "m2po":
        log_ratio = jax.lax.stop_gradient(logprobs_m) - behaviour
        # Called on the whole batch, the trust region is computed here; on a micro-batch it is given.
        trusted = m2po_trusted(log_ratio, mask, cfg.m2_threshold) if m2_trusted is None else m2_trusted
        extra["m2po_masked_frac"] = jnp.sum(metric_weights * ~trusted)
        is_weight = jnp.where(trusted, is_weight, 0.0)
    is_weight = jax.lax.stop_gradient(jnp.where(mask, is_weight, 0.0))
    ratio = jnp.exp(logprobs_m - old)
    adv = advantages[:, None]
    unclipped = ratio * adv
    clipped = jnp.clip(ratio, 1.0 - cfg.eps_low, 1.0 + cfg.eps_high) * adv
    per_token = -is_weight * jnp.minimum(unclipped, clipped)
    metrics = {
        "pg_loss": jnp.sum(weights * per_token),
        "clip_frac": jnp.sum(metric_weights * (clipped < unclipped)),
        "ratio_mean": jnp.sum(metric_weights * ratio),
        "ratio_max": jnp.max(jnp.where(mask, ratio, -jnp.inf)),
        "is_weight_mean": jnp.sum(metric_weights * is_weight),
        "is_weight_max": jnp.max(jnp.where(mask, is_weight, -jnp.inf)),
        **extra,
    }
    if cfg.kl_coef > 0:
        if ref_logprobs is None:
            raise ValueError(f"LossConfig.kl_coef={cfg.kl_coef}: needs TrainBatch.ref_logprobs, got None")
        delta = jnp.where(mask, ref_logprobs, 0.0) - logprobs_m
        kl = jnp.exp(delta) - delta - 1.0  # k3: unbiased, non-negative estimator of KL(pi || ref)
        per_token = per_token + cfg.kl_coef * kl
        metrics["kl"] = jnp.sum(metric_weights * kl)
    if entropy is not None:
        metrics["entropy"] = jnp.sum(metric_weights * jax.lax.stop_gradient(entropy))
    loss = jnp.sum(weights * per_token)
    metrics["loss"] = loss
    return loss, metrics
