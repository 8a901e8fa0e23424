"""GRPO-family losses and their gradients against a loop-by-loop NumPy reference."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_async.trainer.losses import LossConfig, batch_terms, m2po_cutoff, m2po_trusted, policy_loss

N, T = 6, 7


def make_inputs(seed=0):
    rng = np.random.default_rng(seed)
    mask = np.zeros((N, T), np.float32)
    lengths = [3, 1, 5, 2, 4, 0]  # row 5: an empty completion (still a member of its group)
    for i, n in enumerate(lengths):
        mask[i, 2:2 + n] = 1
    logp = rng.uniform(-3, -0.1, (N, T)).astype(np.float32)
    # Behaviour log-probs far enough from logp that the clip and the TIS cap are both hit.
    behaviour = (logp + rng.uniform(-0.6, 0.6, (N, T))).astype(np.float32) * mask
    ref = (logp + rng.uniform(-0.3, 0.3, (N, T))).astype(np.float32) * mask
    rewards = np.array([1.0, 0.0, 0.5, 1.0, 0.0, 0.25], np.float32)
    group_ids = np.array([7, 7, 7, 3, 3, 3], np.int32)
    return logp, behaviour, ref, mask, rewards, group_ids


def areal_m2po_trusted(logp, behaviour, mask, threshold):
    """M2PO's mask as AReaL describes it: while the mean squared log-ratio of the kept tokens
    exceeds the threshold, mask the kept token with the largest one."""
    sq = {(i, t): (logp[i, t] - behaviour[i, t]) ** 2 for i in range(N) for t in range(T) if mask[i, t]}
    kept = dict(sq)
    while kept and np.mean(list(kept.values())) > threshold:
        del kept[max(kept, key=kept.get)]
    return {key: key in kept for key in sq}


def numpy_reference(logp, behaviour, ref, mask, rewards, group_ids, cfg):
    """(loss, d loss / d logp) written token by token, float64."""
    logp, behaviour, ref = (x.astype(np.float64) for x in (logp, behaviour, ref))
    trusted = areal_m2po_trusted(logp, behaviour, mask, cfg.m2_threshold) if cfg.off_policy == "m2po" else {}
    adv = np.zeros(N)
    for i in range(N):
        members = rewards[group_ids == group_ids[i]].astype(np.float64)
        centred = rewards[i] - members.mean()
        adv[i] = centred / (members.std(ddof=1) + cfg.adv_eps) if cfg.advantage == "grpo" else centred
    per_token, grad = np.zeros((N, T)), np.zeros((N, T))
    for i in range(N):
        for t in range(T):
            if not mask[i, t]:
                continue
            if cfg.off_policy == "none":
                r, w = np.exp(logp[i, t] - behaviour[i, t]), 1.0
            else:  # proximal = the current policy: ratio 1 in value, d ratio / d logp = 1
                r, w = 1.0, np.exp(logp[i, t] - behaviour[i, t])
                if cfg.off_policy == "tis":
                    w = min(w, cfg.tis_cap)
                elif cfg.off_policy == "cispo":
                    w = min(max(w, 1 - (cfg.cispo_eps_low if cfg.cispo_eps_low is not None else 1)),
                            1 + cfg.cispo_eps_high)
                elif cfg.off_policy == "m2po" and not trusted[i, t]:
                    w = 0.0
            a = adv[i]
            unclipped, clipped = r * a, np.clip(r, 1 - cfg.eps_low, 1 + cfg.eps_high) * a
            per_token[i, t] = -w * min(unclipped, clipped)
            grad[i, t] = -w * a * r if unclipped <= clipped else 0.0
            if cfg.kl_coef:
                d = ref[i, t] - logp[i, t]
                per_token[i, t] += cfg.kl_coef * (np.exp(d) - d - 1)
                grad[i, t] += cfg.kl_coef * (1 - np.exp(d))
    lengths = mask.sum(1)
    nonempty = [i for i in range(N) if lengths[i] > 0]
    if cfg.aggregation == "seq_mean":
        scale = np.array([1 / (lengths[i] * len(nonempty)) if lengths[i] else 0.0 for i in range(N)])[:, None]
    elif cfg.aggregation == "token_mean":
        scale = np.full((N, 1), 1 / mask.sum())
    else:
        scale = np.full((N, 1), 1 / (len(nonempty) * cfg.norm_len))
    return (per_token * scale).sum(), grad * scale * mask


def jax_loss_and_grad(logp, behaviour, ref, mask, rewards, group_ids, cfg):
    terms = batch_terms(jnp.asarray(mask), jnp.asarray(rewards), jnp.asarray(group_ids), cfg)

    def loss_fn(lp):
        return policy_loss(lp, behaviour_logprobs=jnp.asarray(behaviour), cfg=cfg,
                           ref_logprobs=jnp.asarray(ref), **terms)

    (loss, metrics), grad = jax.value_and_grad(loss_fn, has_aux=True)(jnp.asarray(logp))
    return loss, grad, metrics


CASES = [
    LossConfig(advantage="grpo", aggregation="seq_mean", off_policy="none"),
    LossConfig(advantage="grpo", aggregation="token_mean", off_policy="none", eps_high=0.28),
    LossConfig(advantage="drgrpo", aggregation="drgrpo", off_policy="none", norm_len=10),
    LossConfig(advantage="grpo", aggregation="seq_mean", off_policy="tis", tis_cap=1.2),
    LossConfig(advantage="grpo", aggregation="token_mean", off_policy="decoupled"),
    LossConfig(advantage="drgrpo", aggregation="seq_mean", off_policy="none", kl_coef=0.3),
    LossConfig(advantage="grpo", aggregation="drgrpo", off_policy="tis", kl_coef=0.1, norm_len=8),
    LossConfig(advantage="grpo", aggregation="token_mean", off_policy="cispo"),
    LossConfig(advantage="grpo", aggregation="seq_mean", off_policy="cispo", cispo_eps_low=0.1, cispo_eps_high=0.2),
    LossConfig(advantage="grpo", aggregation="token_mean", off_policy="m2po"),
    LossConfig(advantage="drgrpo", aggregation="seq_mean", off_policy="m2po", m2_threshold=0.08),
]


@pytest.mark.parametrize("cfg", CASES, ids=lambda c: f"{c.advantage}-{c.aggregation}-{c.off_policy}-kl{c.kl_coef}")
def test_loss_and_gradient_match_the_numpy_reference(cfg):
    inputs = make_inputs()
    want_loss, want_grad = numpy_reference(*inputs, cfg)
    loss, grad, metrics = jax_loss_and_grad(*inputs, cfg)
    np.testing.assert_allclose(float(loss), want_loss, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(grad), want_grad, rtol=1e-4, atol=1e-6)
    assert float(metrics["loss"]) == pytest.approx(float(loss))


def test_clipping_is_asymmetric_and_reported_as_clip_fraction():
    logp, behaviour, ref, mask, rewards, group_ids = make_inputs()
    cfg_sym = LossConfig(off_policy="none", eps_low=0.2, eps_high=0.2)
    cfg_high = LossConfig(off_policy="none", eps_low=0.2, eps_high=10.0)
    _, _, m_sym = jax_loss_and_grad(logp, behaviour, ref, mask, rewards, group_ids, cfg_sym)
    _, _, m_high = jax_loss_and_grad(logp, behaviour, ref, mask, rewards, group_ids, cfg_high)
    # Reference clip fraction: tokens whose clipped objective is strictly the smaller one.
    adv = np.asarray(batch_terms(jnp.asarray(mask), jnp.asarray(rewards), jnp.asarray(group_ids), cfg_sym)["advantages"])
    ratio = np.exp(logp - behaviour)
    clipped = np.clip(ratio, 0.8, 1.2) * adv[:, None] < ratio * adv[:, None] - 1e-7
    want = (clipped * mask).sum() / mask.sum()
    assert 0 < want < 1
    assert float(m_sym["clip_frac"]) == pytest.approx(want, rel=1e-5)
    assert float(m_high["clip_frac"]) < float(m_sym["clip_frac"])  # raising eps_high clips less
    assert float(m_sym["ratio_max"]) == pytest.approx(ratio[mask > 0].max(), rel=1e-5)


def test_tis_weight_is_capped_and_decoupled_weight_is_not():
    inputs = make_inputs()
    logp, behaviour, _, mask = inputs[:4]
    _, _, m_tis = jax_loss_and_grad(*inputs, LossConfig(off_policy="tis", tis_cap=1.1))
    _, _, m_dec = jax_loss_and_grad(*inputs, LossConfig(off_policy="decoupled"))
    w = np.exp(logp - behaviour)[mask > 0]
    assert w.max() > 1.1
    assert float(m_tis["is_weight_max"]) == pytest.approx(1.1)
    assert float(m_dec["is_weight_max"]) == pytest.approx(w.max(), rel=1e-5)
    assert float(m_tis["clip_frac"]) == 0.0  # proximal = current policy: ratio exactly 1


def test_decoupled_cap_masks_tokens_above_it():
    inputs = make_inputs()
    logp, behaviour, _, mask = inputs[:4]
    w = np.exp(logp - behaviour) * mask
    cap = float(np.median(w[mask > 0]))
    _, grad, m = jax_loss_and_grad(*inputs, LossConfig(off_policy="decoupled", decoupled_is_cap=cap))
    assert np.all(np.asarray(grad)[w > cap] == 0)
    assert float(m["is_weight_max"]) <= cap


def test_group_advantages_ignore_padding_rows_and_zero_them():
    rewards = jnp.array([1.0, 0.0, 1.0, 5.0, 9.0])
    group_ids = jnp.array([4, 4, 4, -1, -1], jnp.int32)
    mask = jnp.ones((5, 3))
    adv = batch_terms(mask, rewards, group_ids, LossConfig(advantage="grpo", adv_eps=0.0))["advantages"]
    r = np.array([1.0, 0.0, 1.0])
    np.testing.assert_allclose(np.asarray(adv[:3]), (r - r.mean()) / r.std(ddof=1), rtol=1e-6)
    np.testing.assert_array_equal(np.asarray(adv[3:]), 0.0)


def test_weights_split_by_rows_sum_to_the_full_batch_loss():
    """Why micro-batching is exact: the batch normalizers live in the weights."""
    logp, behaviour, ref, mask, rewards, group_ids = make_inputs()
    for cfg in CASES:
        full, _, _ = jax_loss_and_grad(logp, behaviour, ref, mask, rewards, group_ids, cfg)
        terms = batch_terms(jnp.asarray(mask), jnp.asarray(rewards), jnp.asarray(group_ids), cfg)
        if cfg.off_policy == "m2po":  # a whole-batch statistic: the train step computes it first
            terms["m2_trusted"] = m2po_trusted(jnp.asarray(logp - behaviour), jnp.asarray(mask > 0),
                                               cfg.m2_threshold)
        parts = 0.0
        for rows in (slice(0, 2), slice(2, 4), slice(4, 6)):
            part, _ = policy_loss(jnp.asarray(logp[rows]), behaviour_logprobs=jnp.asarray(behaviour[rows]),
                                  ref_logprobs=jnp.asarray(ref[rows]), cfg=cfg,
                                  **{k: v[rows] for k, v in terms.items()})
            parts += float(part)
        assert parts == pytest.approx(float(full), rel=1e-5, abs=1e-7)


@pytest.mark.parametrize("kwargs, field", [
    ({"aggregation": "sum"}, "aggregation"),
    ({"advantage": "rloo"}, "advantage"),
    ({"off_policy": "vtrace"}, "off_policy"),
    ({"aggregation": "drgrpo"}, "norm_len"),
    ({"eps_low": 1.0}, "eps_low"),
    ({"tis_cap": 0.0}, "tis_cap"),
])
def test_loss_config_rejects_bad_values_naming_the_field(kwargs, field):
    with pytest.raises(ValueError, match=f"LossConfig.{field}"):
        LossConfig(**kwargs)


def test_kl_without_reference_logprobs_is_an_error():
    logp, behaviour, _, mask, rewards, group_ids = make_inputs()
    cfg = LossConfig(kl_coef=0.1)
    terms = batch_terms(jnp.asarray(mask), jnp.asarray(rewards), jnp.asarray(group_ids), cfg)
    with pytest.raises(ValueError, match="ref_logprobs"):
        policy_loss(jnp.asarray(logp), behaviour_logprobs=jnp.asarray(behaviour), cfg=cfg, **terms)


def test_cispo_weights_every_token_and_clips_the_weight_not_the_gradient():
    """CISPO's point: no token loses its gradient to the PPO clip; the clip acts on the weight."""
    logp, behaviour, ref, mask, rewards, group_ids = make_inputs()
    cfg = LossConfig(off_policy="cispo", cispo_eps_low=0.1, cispo_eps_high=0.2)
    _, grad, metrics = jax_loss_and_grad(logp, behaviour, ref, mask, rewards, group_ids, cfg)
    adv = np.asarray(batch_terms(jnp.asarray(mask), jnp.asarray(rewards), jnp.asarray(group_ids), cfg)["advantages"])
    live = (mask > 0) & (adv[:, None] != 0)
    assert np.all(np.asarray(grad)[live] != 0) and float(metrics["clip_frac"]) == 0.0
    weight = np.exp(logp - behaviour)[mask > 0]
    assert (weight > 1.2).any() and (weight < 0.9).any()  # both bounds are hit in this batch
    assert float(metrics["is_weight_max"]) == pytest.approx(1.2)


def test_m2po_masks_the_largest_squared_log_ratios_until_the_mean_is_under_the_threshold():
    logp, behaviour, ref, mask, rewards, group_ids = make_inputs()
    cfg = LossConfig(off_policy="m2po", m2_threshold=0.04)
    sq = ((logp - behaviour) ** 2)[mask > 0]
    assert sq.mean() > cfg.m2_threshold  # the trust region binds on this batch
    cutoff = float(m2po_cutoff(jnp.asarray(logp - behaviour), jnp.asarray(mask > 0), cfg.m2_threshold))
    kept = sq[sq <= cutoff]
    assert 0 < kept.size < sq.size and kept.mean() <= cfg.m2_threshold
    assert np.sort(sq)[: kept.size + 1].mean() > cfg.m2_threshold  # the longest such prefix
    _, _, metrics = jax_loss_and_grad(logp, behaviour, ref, mask, rewards, group_ids, cfg)
    assert float(metrics["m2po_masked_frac"]) == pytest.approx(1 - kept.size / sq.size)


def test_m2po_cutoff_keeps_everything_under_the_threshold_and_nothing_when_every_token_is_far():
    mask = jnp.ones((2, 3), bool)
    assert float(m2po_cutoff(jnp.full((2, 3), 0.1), mask, 0.04)) == np.inf  # M2 = 0.01
    assert float(m2po_cutoff(jnp.full((2, 3), 1.0), mask, 0.04)) == -1.0
    half = jnp.asarray([[0.0, 0.0, 0.0], [5.0, 5.0, 0.0]])  # the two 25s go, the four 0s stay
    assert float(m2po_cutoff(half, mask, 0.04)) == 0.0
