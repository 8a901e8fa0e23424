"""The optimizer: AdamW with linear warm-up, cosine decay and global-norm gradient clipping.

Weight decay applies to weight matrices only, not to norm scales or biases (decaying those
towards 0 fights what they implement; the usual LLM practice). The caller says which leaves are
matrices (`decay_paths`): with layer-stacked parameters `ndim` alone cannot tell, the trainer
derives it from the model's logical axes.
"""

from __future__ import annotations

from typing import Any

import jax
import optax

from jaxrl_async.trainer.config import OptimConfig


def make_schedule(cfg: OptimConfig) -> optax.Schedule:
    """Learning rate as a function of the update count (0-based)."""
    return optax.warmup_cosine_decay_schedule(
        init_value=0.0, peak_value=cfg.lr, warmup_steps=cfg.warmup_steps,
        decay_steps=cfg.total_steps, end_value=cfg.lr * cfg.min_lr_ratio)


def make_optimizer(cfg: OptimConfig, decay_paths: frozenset[str] | None = None) -> optax.GradientTransformation:
    """AdamW(+clip). `decay_paths`: the `jax.tree_util.keystr` paths of the leaves to decay (a
    hashable set, so that the jitted step can rebuild the same optimizer from static arguments);
    None decays every leaf with ndim >= 2."""
    def decay_mask(params: Any) -> Any:
        if decay_paths is None:
            return jax.tree.map(lambda p: p.ndim >= 2, params)
        return jax.tree_util.tree_map_with_path(lambda path, _: jax.tree_util.keystr(path) in decay_paths, params)

    adamw = optax.adamw(
        make_schedule(cfg), b1=cfg.b1, b2=cfg.b2, eps=cfg.eps, weight_decay=cfg.weight_decay,
        mask=decay_mask)
    if cfg.max_grad_norm is None:
        return adamw
    return optax.chain(optax.clip_by_global_norm(cfg.max_grad_norm), adamw)
