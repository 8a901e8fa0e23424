"""TRL async GRPO recipe: an in-flight trajectory cap (L1) and a staleness drop at the reader (L3).

Reference "TRL": `max_inflight_tasks` limits trajectories sent to vLLM; a slot frees when its
generation ends, not when the trainer reads it. Default `per_step_traj · max(max_staleness, 1)`.
`RolloutQueueDataset` drops a sample when `version − sample.model_version > max_staleness` and pulls
the next one; `model_version` is fixed when the group is created.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from planner.base import PolicyBase
from planner.configs import check
from planner.policies.blocks import by_completion, cap_room, first_batch
from planner.registry import register
from planner.types import Decision, PlanContext


@dataclass(frozen=True)
class TrlParams:
    """TRL's native parameters (`policy.<name>`).

    Attributes:
        max_staleness: TRL's staleness bound in steps; not given: the run's max_staleness.
        max_inflight_tasks: cap on generating trajectories; null: B·n·max(max_staleness, 1).
    """

    max_staleness: int = 1
    max_inflight_tasks: int | None = None

    def __post_init__(self) -> None:
        check(self.max_staleness >= 0, "policy.max_staleness", self.max_staleness, "must be >= 0")
        m = self.max_inflight_tasks
        check(m is None or m >= 1, "policy.max_inflight_tasks", m, "must be >= 1 or null")


@register
class Trl(PolicyBase):
    """TRL. Mapping from η: `max_staleness = η`.

    L1: in-flight trajectories ≤ `max_inflight_tasks` (counted group_size per group: a group needs
    all its slots). L2: none. L3: in queue (completion) order, drop every done group with
    `step − model_version > max_staleness` (model_version = the version synced at admission, a lower
    bound of every token's version), take the next B. Strict: a trained token has version ≥
    model_version ≥ step − max_staleness.
    """

    name = "trl"
    strict = True
    Params = TrlParams

    def __init__(self, ctx: PlanContext, params: TrlParams | None = None) -> None:
        super().__init__(ctx, params)
        check(self.inflight_cap_groups() >= 1, "policy.max_inflight_tasks", self.params.max_inflight_tasks,
              f"below group_size={ctx.group_size}, no group could ever start")

    @classmethod
    def default_params(cls, ctx: PlanContext) -> dict[str, Any]:
        return {} if ctx.max_staleness is None else {"max_staleness": ctx.max_staleness}

    def inflight_cap_groups(self) -> int:
        per_step_traj = self.B * self.ctx.group_size
        tasks = self.params.max_inflight_tasks or per_step_traj * max(self.params.max_staleness, 1)
        return tasks // self.ctx.group_size

    def admission_quota(self, now: float) -> int:
        return cap_room(self.inflight_cap_groups(), self.inflight)

    def choose_batch(self, step: int, now: float) -> Decision:
        stale = [g for g in self.done if step - g.admit_version > self.params.max_staleness]
        drops = [self.drop(g.uid, "trl_max_staleness") for g in stale]
        return Decision(drop=drops, train=first_batch(by_completion(self.done), self.B))
