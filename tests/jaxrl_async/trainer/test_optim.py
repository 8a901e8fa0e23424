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
