"""AReaL: the StalenessManager capacity (L1 only); staleness is measured, never enforced.

Reference "AReaL": `capacity = (ofp + current_version + 1)·consumer_bs − (accepted + running)`,
`ofp = max_head_offpolicyness`; completing a prompt moves it from running to accepted, so only a
version step frees quota. `current_version` is the version the rollout side holds (set after each
weight update), our `synced`. The workflow executor also caps running rollouts at
`max_concurrent_rollouts` (default: consumer batch size).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from planner.base import PolicyBase
from planner.configs import check
from planner.policies.blocks import by_completion, cap_room, cumulative_room, first_batch
from planner.registry import register
from planner.types import Decision, PlanContext


@dataclass(frozen=True)
class ArealParams:
    """AReaL's native parameters (`policy.<name>`).

    Attributes:
        max_head_offpolicyness: AReaL's staleness bound in versions; not given: max_staleness.
        max_concurrent_rollouts: cap on running groups; null: consumer_batch_size (B), as AReaL.
    """

    max_head_offpolicyness: int = 0
    max_concurrent_rollouts: int | None = None

    def __post_init__(self) -> None:
        ofp = self.max_head_offpolicyness
        check(ofp >= 0, "policy.max_head_offpolicyness", ofp, "must be >= 0")
        m = self.max_concurrent_rollouts
        check(m is None or m >= 1, "policy.max_concurrent_rollouts", m, "must be >= 1 or null")


@register
class Areal(PolicyBase):
    """AReaL. Mapping from η: `max_head_offpolicyness = η`.

    L1: min(staleness capacity, max_concurrent_rollouts − running). L2: none. L3: take B in
    completion order; nothing is dropped. Not strict: a slow group holds one running slot while the
    others keep the trainer (and so the quota) moving.
    """

    name = "areal"
    strict = False
    Params = ArealParams

    @classmethod
    def default_params(cls, ctx: PlanContext) -> dict[str, Any]:
        return {} if ctx.max_staleness is None else {"max_head_offpolicyness": ctx.max_staleness}

    def admission_quota(self, now: float) -> int:
        ofp = self.params.max_head_offpolicyness
        staleness_capacity = cumulative_room(self, lead_groups=ofp * self.B, progress=self.synced)
        concurrency = cap_room(self.params.max_concurrent_rollouts or self.B, self.inflight)
        return min(staleness_capacity, concurrency)

    def choose_batch(self, step: int, now: float) -> Decision:
        return Decision(train=first_batch(by_completion(self.done), self.B))
