"""verl (`trainer.v1.trainer_mode=separate_async`): step-driven prefetch, L3 drop or wait.

Reference "verl": admission prefetches `num_warmup_batches·B` prompts at start and then `B` a
step, i.e. admitted ≤ (num_warmup_batches + step + 1)·B. At admission verl records the trainer
step (`prompt_global_steps`, our `Group.admit_step`); at sampling both strategies use the count
`global_steps − prompt_global_steps + 1`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from planner.base import PolicyBase
from planner.configs import check
from planner.policies.blocks import by_admission, cumulative_room, first_batch
from planner.registry import register
from planner.types import Decision, GroupState, PlanContext


@dataclass(frozen=True)
class VerlParams:
    """verl's native parameters (`policy.<name>`).

    Attributes:
        max_off_policy_threshold: the L3 strategy's bound on `global_steps − prompt_step + 1`;
            null: no L3 strategy, L1 only; not given: max(max_staleness, 1).
        num_warmup_batches: extra batches prefetched before the first step; not given: max_staleness.
    """

    max_off_policy_threshold: int | None = None
    num_warmup_batches: int = 0

    def __post_init__(self) -> None:
        t = self.max_off_policy_threshold
        check(t is None or t >= 1, "policy.max_off_policy_threshold", t, "must be >= 1 or null (at 0 every group would be dropped)")
        check(self.num_warmup_batches >= 0, "policy.num_warmup_batches", self.num_warmup_batches, "must be >= 0")


class _Verl(PolicyBase):
    """Shared L1 of both verl strategies.

    Mapping from η: `max_off_policy_threshold = max(η, 1)`, `num_warmup_batches = η`. A group admitted
    at step s may be trained at k with k − s + 1 ≤ threshold; its tokens are at least the version
    synced at admission (≥ s − 1 when each version syncs before the next step ends), so the drop
    strategy keeps staleness ≤ threshold (= η for η ≥ 1; η = 0 is reachable only without sync lag).
    """

    Params = VerlParams

    @classmethod
    def default_params(cls, ctx: PlanContext) -> dict[str, Any]:
        eta = ctx.max_staleness
        return {} if eta is None else {"max_off_policy_threshold": max(eta, 1), "num_warmup_batches": eta}

    def admission_quota(self, now: float) -> int:
        return cumulative_room(self, lead_groups=self.params.num_warmup_batches * self.B, progress=self.step)

    def waited(self, admit_step: int, step: int) -> int:
        """verl's check value `global_steps − prompt_global_steps + 1`."""
        return step - admit_step + 1


@register
class VerlDrop(_Verl):
    """verl `max_off_policy_strategy=drop`.

    L1 step quota (see `_Verl`), no L2. L3: every done group with
    `global_steps − prompt_step + 1 > max_off_policy_threshold` is dropped (the quota re-admits as
    many); the batch is the B oldest-admitted survivors, else wait.
    """

    name = "verl_drop"
    strict = True

    def choose_batch(self, step: int, now: float) -> Decision:
        t = self.params.max_off_policy_threshold
        stale = [g for g in self.done if t is not None and self.waited(g.admit_step, step) > t]
        drops = [self.drop(g.uid, "verl_off_policy_threshold") for g in stale]
        return Decision(drop=drops, train=first_batch(by_admission(self.done), self.B))


@register
class VerlWait(_Verl):
    """verl `max_off_policy_strategy=wait`.

    L1 step quota, no L2. L3: wait while any *unfinished* group has
    `global_steps − prompt_step + 1 ≥ max_off_policy_threshold`; then take the B oldest-admitted
    done groups. Done groups are never checked again, so a group done early can still be trained
    past the threshold (reference: staleness 4 at the 5th batch with threshold 3) — not strict.
    """

    name = "verl_wait"
    strict = False

    def choose_batch(self, step: int, now: float) -> Decision:
        t = self.params.max_off_policy_threshold
        if t is not None:
            for g in self.groups.values():
                if g.status in (GroupState.QUEUED, GroupState.RUNNING) and self.waited(g.admit_step, step) >= t:
                    return Decision()
        return Decision(train=first_batch(by_admission(self.done), self.B))
