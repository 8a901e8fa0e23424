"""The optimizer: AdamW with linear warm-up, cosine decay and global-norm gradient clipping.

Weight decay applies to weight matrices only, not to norm scales or biases (decaying those
towards 0 fights what they implement; the usual LLM practice). The caller says which leaves are
matrices (`decay_paths`): with layer-stacked parameters `ndim` alone cannot tell, the trainer
derives it from the model's logical axes.

Clipping and Adam's moments are one transformation (`clipped_scale_by_adam`): the clip is a
scalar factor on the gradient, folded into each moment's update, so the clipped gradient is never
a parameter-sized array of its own (0.36 GiB of a step's temporaries at SmolLM2-135M,
docs/memory.md). Its values are `optax.clip_by_global_norm` followed by `optax.scale_by_adam`'s
up to float roundoff.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import optax

from jaxrl_async.trainer.config import OptimConfig


def make_schedule(cfg: OptimConfig) -> optax.Schedule:
    """Learning rate as a function of the update count (0-based)."""
    return optax.warmup_cosine_decay_schedule(
        init_value=0.0, peak_value=cfg.lr, warmup_steps=cfg.warmup_steps,
        decay_steps=cfg.total_steps, end_value=cfg.lr * cfg.min_lr_ratio)


def clipped_scale_by_adam(max_norm: float, b1: float, b2: float, eps: float) -> optax.GradientTransformation:
    """`optax.chain(clip_by_global_norm(max_norm), scale_by_adam(b1, b2, eps))` with the clip as a
    scalar c = min(1, max_norm / ||g||) inside the moments: mu' = b1 mu + (1 - b1) c g and
    nu' = b2 nu + (1 - b2) c^2 g^2. Each moment's update reads only g and scalars, so XLA fuses it
    into one pass over the leaf and writes into the donated moment; c g is never stored. Its state
    is `scale_by_adam`'s."""
    adam = optax.scale_by_adam(b1=b1, b2=b2, eps=eps)

    def update(grads: Any, state: optax.ScaleByAdamState, params: Any = None) -> tuple[Any, optax.ScaleByAdamState]:
        del params
        norm = optax.global_norm(grads)
        clip = jnp.where(norm < max_norm, 1.0, max_norm / norm)
        mu = jax.tree.map(lambda g, m: ((1 - b1) * clip) * g + b1 * m, grads, state.mu)
        # (c' g) g, not c' (g g): XLA would merge g g with the norm's own square and keep it.
        nu = jax.tree.map(lambda g, v: (((1 - b2) * (clip * clip)) * g) * g + b2 * v, grads, state.nu)
        count = optax.safe_increment(state.count)
        mu_hat, nu_hat = optax.tree.bias_correction(mu, b1, count), optax.tree.bias_correction(nu, b2, count)
        updates = jax.tree.map(lambda m, v: m / (jnp.sqrt(v) + eps), mu_hat, nu_hat)
        return updates, optax.ScaleByAdamState(count=count, mu=mu, nu=nu)

    return optax.GradientTransformation(adam.init, update)


def make_optimizer(cfg: OptimConfig, decay_paths: frozenset[str] | None = None) -> optax.GradientTransformation:
    """AdamW(+clip). `decay_paths`: the `jax.tree_util.keystr` paths of the leaves to decay (a
    hashable set, so that the jitted step can rebuild the same optimizer from static arguments);
    None decays every leaf with ndim >= 2."""
    def decay_mask(params: Any) -> Any:
        if decay_paths is None:
            return jax.tree.map(lambda p: p.ndim >= 2, params)
        return jax.tree_util.tree_map_with_path(lambda path, _: jax.tree_util.keystr(path) in decay_paths, params)

    schedule = make_schedule(cfg)
    if cfg.max_grad_norm is None:
        return optax.adamw(schedule, b1=cfg.b1, b2=cfg.b2, eps=cfg.eps, weight_decay=cfg.weight_decay,
                           mask=decay_mask)
    # optax.adamw's chain with the clip folded into its Adam; the outer chain's stateless first
    # element keeps the state layout of chain(clip_by_global_norm, adamw), so checkpoints written
    # with either load in the other.
    return optax.chain(optax.identity(), optax.chain(
        clipped_scale_by_adam(cfg.max_grad_norm, cfg.b1, cfg.b2, cfg.eps),
        optax.add_decayed_weights(cfg.weight_decay, decay_mask),
        optax.scale_by_learning_rate(schedule)))
