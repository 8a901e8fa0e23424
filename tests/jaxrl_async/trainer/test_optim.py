"""The optimizer: its config checks, the learning-rate schedule and the weight-decay mask."""

import dataclasses

import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_async.trainer.optim import OptimConfig, make_optimizer, make_schedule


def test_schedule_warms_up_linearly_then_decays_to_the_floor():
    cfg = OptimConfig(lr=1.0, warmup_steps=10, total_steps=110, min_lr_ratio=0.1)
    lr = make_schedule(cfg)
    assert float(lr(0)) == 0 and float(lr(5)) == pytest.approx(0.5) and float(lr(10)) == pytest.approx(1.0)
    assert float(lr(60)) == pytest.approx(0.55, rel=1e-4)  # cosine midpoint between 1 and 0.1
    assert float(lr(110)) == pytest.approx(0.1) and float(lr(500)) == pytest.approx(0.1)


def test_weight_decay_touches_only_the_listed_leaves():
    cfg = OptimConfig(lr=0.1, weight_decay=0.5, b1=0.0, b2=0.0, eps=1e-12)
    tx = make_optimizer(cfg, decay_paths=frozenset({"['w']"}))
    params = {"w": jnp.ones((2, 2)), "norm": jnp.ones((2, 2))}
    zero = {k: jnp.zeros_like(v) for k, v in params.items()}
    updates, _ = tx.update(zero, tx.init(params), params)
    np.testing.assert_allclose(updates["w"], -0.1 * 0.5)  # decay only
    np.testing.assert_array_equal(updates["norm"], 0.0)


def test_optim_config_refuses_bad_values_naming_the_field():
    with pytest.raises(ValueError, match="OptimConfig.warmup_steps=20 > total_steps=10"):
        OptimConfig(warmup_steps=20, total_steps=10)
    with pytest.raises(ValueError, match="OptimConfig.lr"):
        dataclasses.replace(OptimConfig(), lr=0.0)


def reference_adamw(cfg: OptimConfig) -> "optax.GradientTransformation":  # noqa: F821
    """optax's own clip-then-AdamW, what `make_optimizer` must equal."""
    import jax
    import optax
    return optax.chain(optax.clip_by_global_norm(cfg.max_grad_norm),
                       optax.adamw(make_schedule(cfg), b1=cfg.b1, b2=cfg.b2, eps=cfg.eps,
                                   weight_decay=cfg.weight_decay,
                                   mask=lambda p: jax.tree.map(lambda x: x.ndim >= 2, p)))


@pytest.mark.parametrize("grad_scale, clips", [(1e-3, False), (10.0, True)])
def test_the_clip_folded_into_adam_updates_params_and_moments_as_optax_clip_then_adamw(grad_scale, clips):
    import jax
    import optax
    cfg = OptimConfig(lr=1e-2, weight_decay=0.1, max_grad_norm=1.0, warmup_steps=0, min_lr_ratio=1.0)
    rng = np.random.default_rng(0)
    params = {"w": jnp.asarray(rng.normal(size=(16, 8)), jnp.float32), "b": jnp.asarray(rng.normal(size=(8,)), jnp.float32)}
    ours, ref = make_optimizer(cfg), reference_adamw(cfg)
    p_ours, s_ours, p_ref, s_ref = params, ours.init(params), params, ref.init(params)
    # The state keeps the layout of optax's chain: a checkpoint of either loads in the other.
    assert jax.tree.structure(s_ours) == jax.tree.structure(s_ref)
    for step in range(3):
        grads = jax.tree.map(lambda x: jnp.asarray(rng.normal(size=x.shape) * grad_scale, jnp.float32), params)
        assert (float(optax.global_norm(grads)) > cfg.max_grad_norm) == clips
        u, s_ours = ours.update(grads, s_ours, p_ours)
        p_ours = optax.apply_updates(p_ours, u)
        u, s_ref = ref.update(grads, s_ref, p_ref)
        p_ref = optax.apply_updates(p_ref, u)
    assert float(jnp.max(jnp.abs(p_ours["w"] - params["w"]))) > 1e-3  # non-trivial: the params moved
    for x, y in zip(jax.tree.leaves((p_ours, s_ours)), jax.tree.leaves((p_ref, s_ref))):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=2e-6, atol=1e-9)


def test_the_clip_folded_into_adam_keeps_no_parameter_sized_temporaries():
    """An update as the train step jits it (the norm computed beside it for the skip check, params
    and moments donated): optax's clip-then-AdamW keeps a [1024, 1024] float32 square or clipped
    gradient per leaf; the folded clip writes the moments in one pass over the gradient."""
    import jax
    import optax
    cfg = OptimConfig(max_grad_norm=1.0)
    params = {name: jnp.zeros((1024, 1024), jnp.float32) for name in "abcd"}

    def temp_bytes(tx) -> int:
        def step(params, state, grads):
            updates, state = tx.update(grads, state, params)
            return optax.apply_updates(params, updates), state, optax.global_norm(grads)
        state = jax.eval_shape(tx.init, params)
        return jax.jit(step, donate_argnums=(0, 1)).lower(params, state, params).compile().memory_analysis().temp_size_in_bytes

    leaf = 1024 * 1024 * 4
    reference, ours = temp_bytes(reference_adamw(cfg)), temp_bytes(make_optimizer(cfg))
    assert reference >= leaf and ours < leaf, (reference, ours)
