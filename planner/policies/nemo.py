"""NeMo-RL's four prompt-group samplers (`nemo_rl/algorithms/async_utils/staleness_sampler.py`).

All four share two capacity limits: `max_inflight_prompts` generating and `max_buffered_rollouts`
admitted but not yet trained or dropped (reserved before generation starts). The three *gated*
samplers also admit at most one dispatch batch per trainer version beyond a lookahead window:
batch i may dispatch once i ≤ version + window, i.e. admitted ≤ (window + version + 1)·B, where
version is the weight version the generation side holds (our `synced`). A group's version below
is its start weight (earliest token version; the admission version while still queued). All
samplers fill a batch in completion order (the reference: "按照快慢顺序填充").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from planner.base import Group, PolicyBase
from planner.configs import check
from planner.policies.blocks import (
    bound_batch,
    by_completion,
    cap_room,
    cumulative_room,
    drop_all,
    first_batch,
    older_than,
    planned_batch_index,
    running_groups,
)
from planner.registry import register
from planner.types import Admission, Decision, PlanContext, Status


def _check_caps(params: Any) -> None:
    for name in ("max_inflight_prompts", "max_buffered_rollouts"):
        v = getattr(params, name)
        check(v is None or v >= 1, f"policy.{name}", v, "must be >= 1 or null")


@dataclass(frozen=True)
class NemoStalenessParams:
    max_staleness_versions: int = 1
    max_inflight_prompts: int | None = None  # None = B·(max_staleness_versions + 1)
    max_buffered_rollouts: int | None = None  # None = B·(max_staleness_versions + 1)

    def __post_init__(self) -> None:
        v = self.max_staleness_versions
        check(v >= 0, "policy.max_staleness_versions", v, "must be >= 0")
        _check_caps(self)


@dataclass(frozen=True)
class NemoLookaheadParams:
    max_lookahead_versions: int = 1
    max_inflight_prompts: int | None = None  # None = B·(max_lookahead_versions + 1)
    max_buffered_rollouts: int | None = None  # None = B·(max_lookahead_versions + 1)

    def __post_init__(self) -> None:
        v = self.max_lookahead_versions
        check(v >= 0, "policy.max_lookahead_versions", v, "must be >= 0")
        _check_caps(self)


class _Nemo(PolicyBase):
    """The two capacity limits; subclasses add the gate and the sampler's L2/L3."""

    window_param = "max_staleness_versions"

    @classmethod
    def default_params(cls, ctx: PlanContext) -> dict[str, Any]:
        return {} if ctx.max_staleness is None else {cls.window_param: ctx.max_staleness}

    @property
    def window(self) -> int:
        return getattr(self.params, self.window_param)

    def capacity_room(self) -> int:
        default = self.B * (self.window + 1)  # NeMo's required_buffer_capacity
        inflight = cap_room(self.params.max_inflight_prompts or default, self.inflight)
        buffered = cap_room(self.params.max_buffered_rollouts or default, self.untrained)
        return min(inflight, buffered)

    def admission_quota(self, now: float) -> int:
        return self.capacity_room()

    def evict_below_window(self, step: int) -> list:
        """Drop done groups that left the window [step − window, step] (NeMo's default `evict`)."""
        return drop_all(self, older_than(self.done, step - self.window), "nemo_evict_stale")


class _Gated(_Nemo):
    def admission_quota(self, now: float) -> int:
        gate = cumulative_room(self, lead_groups=self.window * self.B, progress=self.synced)
        return min(gate, self.capacity_room())


@register
class NemoWindowed(_Nemo):
    """NeMo-RL `windowed`. Mapping from η: `max_staleness_versions = η`.

    L1: the two capacity limits only (no gate on training progress). L2 before each weight sync
    (`on_version_published(v)`): abort running groups started before v − η. L3 at step k: evict
    done groups started before k − η, take B in completion order. Strict.
    """

    name = "nemo_windowed"
    strict = True
    Params = NemoStalenessParams

    def on_version_published(self, *, version: int, now: float) -> Decision:
        super().on_version_published(version=version, now=now)
        stale = older_than(running_groups(self), version - self.window)
        return Decision(drop=drop_all(self, stale, "nemo_abort_inflight"))

    def choose_batch(self, step: int, now: float) -> Decision:
        drops = self.evict_below_window(step)
        return Decision(drop=drops, train=first_batch(by_completion(self.done), self.B))


@register
class NemoWeightFifo(_Gated):
    """NeMo-RL `weight_fifo`. Mapping from η: `max_staleness_versions = η`.

    L1: gate of η batches plus capacity limits. L2: none. L3 at step k: evict done groups below
    the window; the target is the oldest version among untrained in-window groups (done or not);
    only its done groups are taken, in completion order, and the trainer waits until B are.
    Strict, no drops in practice (the gate keeps every version's cohort trainable in its window).

    Deviation (documented): when the target version has no group left generating and fewer than B
    done, the next versions fill the batch in order — NeMo would wait forever on such a remainder
    (a cohort that is not a multiple of B, which group-wise admission can produce).
    """

    name = "nemo_weight_fifo"
    strict = True
    Params = NemoStalenessParams

    def choose_batch(self, step: int, now: float) -> Decision:
        drops = self.evict_below_window(step)
        cohorts: dict[int, list[Group]] = {}
        for g in self.groups.values():
            if g.min_version >= step - self.window:  # a straggler below the window is evicted when done
                cohorts.setdefault(g.min_version, []).append(g)
        picked: list[Group] = []
        for version in sorted(cohorts):
            members = cohorts[version]
            picked += by_completion(g for g in members if g.status == Status.DONE)
            if len(picked) >= self.B or any(g.status != Status.DONE for g in members):
                break  # never skip past a version that is still generating
        return Decision(drop=drops, train=first_batch(picked, self.B))


@register
class NemoReadyFirst(_Gated):
    """NeMo-RL `ready_first`. Mapping from η: `max_staleness_versions = η` (gate only).

    L1: gate of η batches plus capacity limits. L2: none. L3: B done groups in completion order,
    no version check, nothing evicted. Not strict: a slow group is overtaken and trained late.
    """

    name = "nemo_ready_first"
    strict = False
    Params = NemoStalenessParams

    def choose_batch(self, step: int, now: float) -> Decision:
        return Decision(train=first_batch(by_completion(self.done), self.B))


@register
class NemoInOrder(_Gated):
    """NeMo-RL `in_order`. Mapping from η: `max_lookahead_versions = η`.

    L1: gate of η batches plus capacity limits; dispatch batch i (the i-th B admissions) is
    stamped `target_step = i`. L2: none. L3 at step k: only batch k, once all its groups are done;
    wait otherwise. Strict: batch i dispatches at synced version ≥ i − η and trains at step i.
    """

    name = "nemo_in_order"
    strict = True
    Params = NemoLookaheadParams
    window_param = "max_lookahead_versions"

    def make_admission(self, group: Group) -> Admission:
        target = planned_batch_index(group, self.B)
        return Admission(group.uid, group.prompt_id, group.admit_version, priority=float(group.seq), planned_step=target)

    def choose_batch(self, step: int, now: float) -> Decision:
        return Decision(train=bound_batch(self, step))
