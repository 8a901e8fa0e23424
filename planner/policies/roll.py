"""ROLL: `async_generation_ratio` drives L1 quota, L2 cancellation and the L3 version window.

Reference "ROLL" (ratio 2, 32 prompts): the first round gets B + ceil(B·ratio) prompts and then B
a step, counting running plus completed prompts. At train version v only trajectories started at
≥ v − ratio are sampled, oldest start first; right after the batch of v is sampled (before the
next weight sync) every task started too early for v + 1 is removed, running ones cancelled.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from planner.base import PolicyBase
from planner.configs import check
from planner.policies.blocks import (
    batch_lead,
    by_version,
    cumulative_room,
    drop_all,
    first_batch,
    older_than,
    running_groups,
)
from planner.registry import register
from planner.types import Decision, PlanContext


@dataclass(frozen=True)
class RollParams:
    """ROLL's native parameters (`policy.<name>`).

    Attributes:
        async_generation_ratio: ROLL's rollouts ahead of training, in steps; not given: max_staleness.
    """

    async_generation_ratio: float = 0.0

    def __post_init__(self) -> None:
        r = self.async_generation_ratio
        check(r >= 0, "policy.async_generation_ratio", r, "must be >= 0")


@register
class Roll(PolicyBase):
    """ROLL. Mapping from η: `async_generation_ratio = η`.

    L1: admitted ≤ ceil(B·ratio) + (step + 1)·B (+ re-admitted drops). L3 at step k: drop done
    groups started before ceil(k − ratio); take B by (start version, completion). L2, in the same
    decision once the batch is taken: cancel running and done groups started before
    ceil(k + 1 − ratio) — they can never be trained at k + 1. Strict: start ≥ k − ratio.
    """

    name = "roll"
    strict = True
    Params = RollParams

    @classmethod
    def default_params(cls, ctx: PlanContext) -> dict[str, Any]:
        return {} if ctx.max_staleness is None else {"async_generation_ratio": float(ctx.max_staleness)}

    def min_start(self, step: int) -> int:
        return math.ceil(step - self.params.async_generation_ratio)

    def admission_quota(self, now: float) -> int:
        lead = batch_lead(self.B, self.params.async_generation_ratio)
        return cumulative_room(self, lead_groups=lead, progress=self.step)

    def choose_batch(self, step: int, now: float) -> Decision:
        drops = drop_all(self, older_than(self.done, self.min_start(step)), "roll_l3_window")
        batch = first_batch(by_version(self.done), self.B)
        if batch is None:
            return Decision(drop=drops)
        chosen = set(batch)
        too_old = older_than(running_groups(self) + [g for g in self.done if g.uid not in chosen], self.min_start(step + 1))
        drops += drop_all(self, too_old, "roll_l2_cancel")
        return Decision(drop=drops, train=batch)
