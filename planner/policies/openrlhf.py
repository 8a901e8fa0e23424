"""OpenRLHF async training: `async_queue_size` batch permits (L1 only).

Reference "OpenRLHF": the generator takes a permit before it prepares a batch and puts the whole
batch on a queue; the permit comes back when the trainer takes that batch (not when it finishes
training it). No L2, no L3 check.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from planner.base import Group, PolicyBase
from planner.configs import check
from planner.policies.blocks import bound_batch, planned_batch_index
from planner.registry import register
from planner.types import Admission, Decision, PlanContext


@dataclass(frozen=True)
class OpenrlhfParams:
    """OpenRLHF's native parameters (`policy.<name>`).

    Attributes:
        async_queue_size: OpenRLHF's queue of generated batches; not given: max(max_staleness, 1).
    """

    async_queue_size: int = 1

    def __post_init__(self) -> None:
        check(self.async_queue_size >= 1, "policy.async_queue_size", self.async_queue_size, "must be >= 1")


@register
class Openrlhf(PolicyBase):
    """OpenRLHF. Mapping from η: `async_queue_size = max(η, 1)`.

    L1: the i-th B admissions form generation batch i; batch i may start once the trainer has
    taken batch i − async_queue_size (admitted ≤ (async_queue_size + taken)·B). L2: none.
    L3: the queue hands over whole batches in generation order: batch i is trained at step i once
    all its groups are done (the trainer waits for a batch's slowest group). Not strict: nothing
    checks versions; a batch admitted before the previous version synced is one step staler.
    """

    name = "openrlhf"
    strict = False
    Params = OpenrlhfParams

    @classmethod
    def default_params(cls, ctx: PlanContext) -> dict[str, Any]:
        return {} if ctx.max_staleness is None else {"async_queue_size": max(ctx.max_staleness, 1)}

    def admission_quota(self, now: float) -> int:
        taken_batches = self.trained_total // self.B
        return (self.params.async_queue_size + taken_batches) * self.B - self.admitted_total

    def make_admission(self, group: Group) -> Admission:
        batch = planned_batch_index(group, self.B)
        return Admission(group.uid, group.prompt_id, group.admit_version, priority=float(group.seq), planned_step=batch)

    def choose_batch(self, step: int, now: float) -> Decision:
        return Decision(train=bound_batch(self, step))
