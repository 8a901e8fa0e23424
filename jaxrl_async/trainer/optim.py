"""The optimizer: AdamW with linear warm-up, cosine decay and global-norm gradient clipping.

Weight decay applies to weight matrices only, not to norm scales or biases (decaying those
towards 0 fights what they implement; the usual LLM practice). The caller says which leaves are
matrices (`decay_paths`): with layer-stacked parameters `ndim` alone cannot tell, the trainer
derives it from the model's logical axes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import jax
import optax

from planner.configs import check


@dataclass(frozen=True)
class OptimConfig:
    """`trainer.optim`: AdamW with linear warm-up, cosine decay and gradient clipping.

    Attributes:
      lr: peak learning rate, reached after `warmup_steps`
      warmup_steps: linear ramp from 0 to `lr`
      total_steps: warm-up + cosine decay length; constant `lr * min_lr_ratio` after
      min_lr_ratio: final learning rate as a fraction of `lr`
      b1: Adam's first-moment decay
      b2: Adam's second-moment decay
      eps: Adam's denominator floor
      weight_decay: AdamW decay of the weight matrices
      max_grad_norm: clip the global gradient norm to it; None = no clipping
    """

    lr: float = 1e-6
    warmup_steps: int = 0
    total_steps: int = 1000
    min_lr_ratio: float = 0.1
    b1: float = 0.9
    b2: float = 0.999
    eps: float = 1e-8
    weight_decay: float = 0.01
    max_grad_norm: float | None = 1.0

    def __post_init__(self) -> None:
        check(self.lr > 0, "OptimConfig.lr", self.lr, "must be > 0")
        check(self.warmup_steps >= 0, "OptimConfig.warmup_steps", self.warmup_steps, "must be >= 0")
        check(self.total_steps > 0, "OptimConfig.total_steps", self.total_steps, "must be > 0")
        if self.warmup_steps > self.total_steps:
            raise ValueError(
                f"OptimConfig.warmup_steps={self.warmup_steps} > total_steps={self.total_steps}: "
                "the warm-up is part of the schedule")
        check(0 <= self.min_lr_ratio <= 1, "OptimConfig.min_lr_ratio", self.min_lr_ratio, "must be in [0, 1]")
        for name in ("b1", "b2"):
            check(0 <= getattr(self, name) < 1, f"OptimConfig.{name}", getattr(self, name), "must be in [0, 1)")
        check(self.weight_decay >= 0, "OptimConfig.weight_decay", self.weight_decay, "must be >= 0")
        check(self.max_grad_norm is None or self.max_grad_norm > 0, "OptimConfig.max_grad_norm", self.max_grad_norm,
              "must be > 0 or None")


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
