"""SkyRL fully async: AReaL's capacity with `max_staleness_steps`; stale groups are only counted.

Reference "SkyRL": quota grows one batch per trainer step after `max_staleness_steps` batches of
lead, minus completed and running prompts; at sampling `global_step − global_step_when_scheduled >
max_staleness_steps` logs a warning and counts it ("TODO: should we drop ... or just log?"), the
group is still trained. Generation runs on `num_parallel_generation_workers` workers.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from planner.base import PolicyBase
from planner.configs import check
from planner.policies.blocks import by_completion, cap_room, cumulative_room, first_batch
from planner.registry import register
from planner.types import Decision, PlanContext


@dataclass(frozen=True)
class SkyrlParams:
    """SkyRL's native parameters (`policy.<name>`).

    Attributes:
        max_staleness_steps: SkyRL's staleness bound in steps; not given: max_staleness.
        num_parallel_generation_workers: cap on generating groups; null: B·(max_staleness_steps + 1).
    """

    max_staleness_steps: int = 1
    num_parallel_generation_workers: int | None = None

    def __post_init__(self) -> None:
        check(self.max_staleness_steps >= 0, "policy.max_staleness_steps", self.max_staleness_steps, "must be >= 0")
        w = self.num_parallel_generation_workers
        check(w is None or w >= 1, "policy.num_parallel_generation_workers", w, "must be >= 1 or null")


@register
class Skyrl(PolicyBase):
    """SkyRL. Mapping from η: `max_staleness_steps = η`.

    L1: cumulative quota (max_staleness_steps + step + 1)·B by trainer step, and at most
    `num_parallel_generation_workers` groups generating. L2: none. L3: completion order; groups
    scheduled more than `max_staleness_steps` steps ago are counted in `stale_warnings` and trained
    anyway. Not strict.
    """

    name = "skyrl"
    strict = False
    Params = SkyrlParams

    def __init__(self, ctx: PlanContext, params: SkyrlParams | None = None) -> None:
        super().__init__(ctx, params)
        self.stale_warnings = 0

    @classmethod
    def default_params(cls, ctx: PlanContext) -> dict[str, Any]:
        return {} if ctx.max_staleness is None else {"max_staleness_steps": ctx.max_staleness}

    def admission_quota(self, now: float) -> int:
        lead = self.params.max_staleness_steps
        workers = self.params.num_parallel_generation_workers or self.B * (lead + 1)
        return min(cumulative_room(self, lead_groups=lead * self.B, progress=self.step), cap_room(workers, self.inflight))

    def choose_batch(self, step: int, now: float) -> Decision:
        batch = first_batch(by_completion(self.done), self.B)
        if batch is not None:
            limit = self.params.max_staleness_steps
            self.stale_warnings += sum(step - self.groups[uid].admit_step > limit for uid in batch)
        return Decision(train=batch)

    def extra_state(self) -> dict[str, Any]:
        return {"stale_warnings": self.stale_warnings}

    def load_extra_state(self, state: Mapping[str, Any]) -> None:
        self.stale_warnings = int(state["stale_warnings"])
