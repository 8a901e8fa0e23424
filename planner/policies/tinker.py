"""tinker-cookbook's paced async sampling (`tinker_cookbook/rl/train.py`, pull request 822:
"enforce staleness by pacing sampling instead of discarding rollouts").

Upstream's names: K = `max_steps_off_policy` (the hard bound: a group sampled with the sampler
version of iteration s is trained at iteration t only if t − s ≤ K), `pipeline_depth` (how far
sampling runs ahead; null = min(1, K); 0 ≤ depth ≤ K) and `groups_per_batch` (our B). Its
`_InFlightGroupTracker` paces rollout starts:

- at most B·(depth + 1) groups *outstanding* (started, not trained); a trained batch's slots are
  released only once the new sampling client is in place, so that new rollouts sample from the
  new weights — here, once the generation side holds the new version (`synced`);
- one rollout worker per batch slot: at most B groups in flight;
- before training iteration t the trainer waits until no rollout of version ≤ t − K is still in
  flight (its last chance), then trains the B stalest completed groups (stable sort on the
  version, completion order among equals). Nothing is discarded.

A group's version s is the sampling client's step when its rollout starts; tinker's sampling
client is an immutable snapshot taken at slot acquisition, so here s is the version the group is
dispatched on (`admit_version`). Tokens the simulator generates later on newer weights are only
fresher, so t − s bounds their staleness.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from planner.base import PolicyBase
from planner.configs import check
from planner.policies.blocks import cap_room, cumulative_room, dispatched_before, first_batch, inflight_groups
from planner.registry import register
from planner.types import Decision, PlanContext


@dataclass(frozen=True)
class TinkerParams:
    """tinker-cookbook's native parameters (`policy.<name>`).

    Attributes:
        max_steps_off_policy: the staleness bound K in steps; not given: max_staleness (upstream
            has no default, a required field; 1 here without one, like NeMo-RL's and TRL's).
        pipeline_depth: batches sampled ahead of the trainer, in [0, max_steps_off_policy]; null:
            min(1, max_steps_off_policy), as upstream.
    """

    max_steps_off_policy: int = 1
    pipeline_depth: int | None = None

    def __post_init__(self) -> None:
        k = self.max_steps_off_policy
        check(k >= 0, "policy.max_steps_off_policy", k, "must be >= 0")
        d = self.pipeline_depth
        check(d is None or 0 <= d <= k, "policy.pipeline_depth", d,
              f"must be null or in [0, max_steps_off_policy={k}] (a pipeline deeper than the staleness bound "
              "would violate it)")

    @property
    def resolved_pipeline_depth(self) -> int:
        return min(1, self.max_steps_off_policy) if self.pipeline_depth is None else self.pipeline_depth


@register
class TinkerPaced(PolicyBase):
    """tinker-cookbook paced sampling. Mapping from η: `max_steps_off_policy = η`;
    `pipeline_depth` keeps upstream's default min(1, η).

    L1: min(B·(depth + 1) − (admitted − B·synced), B − in flight). L2: none. L3 at step t: wait
    while a group dispatched on a version ≤ t − K is in flight or fewer than B are done; then
    the B done groups with the oldest versions. Strict at K (`staleness_bound`); never drops.
    """

    name = "tinker_paced"
    strict = True
    Params = TinkerParams

    @classmethod
    def default_params(cls, ctx: PlanContext) -> dict[str, Any]:
        return {} if ctx.max_staleness is None else {"max_steps_off_policy": ctx.max_staleness}

    def staleness_bound(self) -> int:
        return self.params.max_steps_off_policy

    def admission_quota(self, now: float) -> int:
        depth = self.params.resolved_pipeline_depth
        outstanding_room = cumulative_room(self, lead_groups=depth * self.B, progress=self.synced)
        workers = cap_room(self.B, self.inflight)  # one rollout worker per batch slot
        return min(outstanding_room, workers)

    def choose_batch(self, step: int, now: float) -> Decision:
        deadline = step - self.params.max_steps_off_policy
        if dispatched_before(inflight_groups(self), deadline + 1):
            return Decision()  # a rollout at its staleness deadline is still running: wait for it
        stalest_first = sorted(self.done, key=lambda g: g.admit_version)  # stable: completion order among equals
        return Decision(train=first_batch(stalest_first, self.B))
