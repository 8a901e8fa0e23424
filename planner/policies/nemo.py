"""NeMo-RL's four prompt-group samplers (`nemo_rl/algorithms/async_utils/staleness_sampler.py`).

All four share two capacity limits: `max_inflight_prompts` generating and `max_buffered_rollouts`
admitted but not yet trained or dropped (reserved before generation starts). The three *gated*
samplers also admit at most one dispatch batch per trainer version beyond a lookahead window:
batch i may dispatch once i ≤ version + window, i.e. admitted ≤ (window + version + 1)·B, where
version is the weight version the generation side holds (our `synced`); they refuse a buffer cap
below that window, B·(window + 1), as upstream's `validate_sampler_buffer_capacity` does.

As upstream's replay buffer, a group's version is the weight version it was *dispatched* on (the
slot is reserved with it before generation: our admission version `admit_version`), so a request
still queued in an engine is aborted and evicted like a running one; and a batch takes ready
groups in buffer order — the order groups were dispatched, not the order they finished.
Upstream's unit tests, ported onto this API: tests/planner/policies/test_nemo_upstream.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from planner.base import Group, PolicyBase
from planner.configs import check
from planner.policies.blocks import (
    bound_batch,
    by_admission,
    cap_room,
    cumulative_room,
    dispatched_before,
    drop_all,
    first_batch,
    inflight_groups,
    planned_batch_index,
)
from planner.registry import register
from planner.types import Admission, Decision, GroupState, PlanContext


def _check_caps(params: Any) -> None:
    for name in ("max_inflight_prompts", "max_buffered_rollouts"):
        v = getattr(params, name)
        check(v is None or v >= 1, f"policy.{name}", v, "must be >= 1 or null")


@dataclass(frozen=True)
class NemoStalenessParams:
    """The native parameters of NeMo-RL's `weight_fifo` and `ready_first` samplers (`policy.<name>`).

    Attributes:
        max_staleness_versions: NeMo-RL's staleness bound in versions; not given: max_staleness.
        max_inflight_prompts: cap on generating groups; null: B·(max_staleness_versions + 1).
        max_buffered_rollouts: cap on admitted, untrained groups; null: B·(max_staleness_versions + 1).
    """

    max_staleness_versions: int = 1
    max_inflight_prompts: int | None = None
    max_buffered_rollouts: int | None = None

    def __post_init__(self) -> None:
        v = self.max_staleness_versions
        check(v >= 0, "policy.max_staleness_versions", v, "must be >= 0")
        _check_caps(self)


@dataclass(frozen=True)
class NemoWindowedParams(NemoStalenessParams):
    """The native parameters of NeMo-RL's `windowed` sampler (`policy.<name>`).

    Attributes:
        max_staleness_versions: NeMo-RL's staleness bound in versions; not given: max_staleness.
        max_inflight_prompts: cap on generating groups; null: B·(max_staleness_versions + 1).
        max_buffered_rollouts: cap on admitted, untrained groups; null: B·(max_staleness_versions + 1).
        sample_freshest_first: take the freshest in-window version first (upstream's option).
    """

    sample_freshest_first: bool = False


@dataclass(frozen=True)
class NemoLookaheadParams:
    """The native parameters of NeMo-RL's `in_order` sampler (`policy.<name>`).

    Attributes:
        max_lookahead_versions: versions ahead a prompt may be bound to; not given: max_staleness.
        max_inflight_prompts: cap on generating groups; null: B·(max_lookahead_versions + 1).
        max_buffered_rollouts: cap on admitted, untrained groups; null: B·(max_lookahead_versions + 1).
    """

    max_lookahead_versions: int = 1
    max_inflight_prompts: int | None = None
    max_buffered_rollouts: int | None = None

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
        """Drop *ready* groups dispatched below the window [step − window, step] (NeMo's default
        `evict`; a slot still generating is skipped)."""
        return drop_all(self, dispatched_before(self.done, step - self.window), "nemo_evict_stale")

    def in_window(self, groups, step: int) -> list[Group]:
        """Groups dispatched on a version in [step − window, step], in dispatch (buffer) order."""
        return by_admission(g for g in groups if step - self.window <= g.admit_version <= step)


class _Gated(_Nemo):
    """One dispatch batch per trainer version beyond the window (upstream `_GatedSampler`)."""

    def __init__(self, ctx: PlanContext, params: Any | None = None) -> None:
        super().__init__(ctx, params)
        required = self.B * (self.window + 1)  # upstream's required_buffer_capacity
        cap = self.params.max_buffered_rollouts
        check(cap is None or cap >= required, "policy.max_buffered_rollouts", cap,
              f"below the {self.name} sampler's required capacity batch_groups·({self.window_param} + 1) = "
              f"{required}; admission would deadlock waiting for buffer slots")

    def admission_quota(self, now: float) -> int:
        gate = cumulative_room(self, lead_groups=self.window * self.B, progress=self.synced)
        return min(gate, self.capacity_room())


@register
class NemoWindowed(_Nemo):
    """NeMo-RL `windowed`. Mapping from η: `max_staleness_versions = η`.

    L1: the two capacity limits only (no gate on training progress). L2 before each weight sync
    (`on_version_published(v)`): abort groups in flight — queued in an engine or running —
    dispatched before v − η (upstream `should_abort_inflight`). L3 at step k: evict done groups
    dispatched before k − η, take B in-window done groups in dispatch order, or the freshest
    version first with `sample_freshest_first` (ties in dispatch order). Strict.
    """

    name = "nemo_windowed"
    strict = True
    Params = NemoWindowedParams

    def on_version_published(self, *, version: int, now: float) -> Decision:
        super().on_version_published(version=version, now=now)
        stale = dispatched_before(inflight_groups(self), version - self.window)
        return Decision(drop=drop_all(self, stale, "nemo_abort_inflight"))

    def choose_batch(self, step: int, now: float) -> Decision:
        drops = self.evict_below_window(step)
        ready = self.in_window(self.done, step)
        if self.params.sample_freshest_first:
            ready.sort(key=lambda g: (step - g.admit_version, g.seq))
        return Decision(drop=drops, train=first_batch(ready, self.B))


@register
class NemoWeightFifo(_Gated):
    """NeMo-RL `weight_fifo`. Mapping from η: `max_staleness_versions = η`.

    L1: gate of η batches plus capacity limits. L2: none. L3 at step k: evict done groups below
    the window; the target is the oldest dispatch version among untrained in-window groups (done
    or not); only its done groups are taken, in dispatch order, and the trainer waits until B are.
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
        for g in self.in_window(self.groups.values(), step):  # a straggler below it is evicted when done
            cohorts.setdefault(g.admit_version, []).append(g)
        picked: list[Group] = []
        for version in sorted(cohorts):
            members = cohorts[version]
            picked += [g for g in members if g.status == GroupState.DONE]
            if len(picked) >= self.B or any(g.status != GroupState.DONE for g in members):
                break  # never skip past a version that is still generating
        return Decision(drop=drops, train=first_batch(picked, self.B))


@register
class NemoReadyFirst(_Gated):
    """NeMo-RL `ready_first`. Mapping from η: `max_staleness_versions = η` (gate only).

    L1: gate of η batches plus capacity limits. L2: none. L3: B done groups dispatched on a
    version ≤ k, in dispatch order, no lower version check, nothing evicted. Not strict: a slow
    group is overtaken and trained late.
    """

    name = "nemo_ready_first"
    strict = False
    Params = NemoStalenessParams

    def choose_batch(self, step: int, now: float) -> Decision:
        ready = by_admission(g for g in self.done if g.admit_version <= step)
        return Decision(train=first_batch(ready, self.B))


@register
class NemoInOrder(_Gated):
    """NeMo-RL `in_order`. Mapping from η: `max_lookahead_versions = η`.

    L1: gate of η batches plus capacity limits; dispatch batch i (the i-th B admissions) is
    stamped `target_step = i`. L2: none. L3 at step k: evict done groups stamped for a step before
    k (unreachable here, see below); only batch k, once all its groups are done; wait otherwise. Strict: batch i dispatches at synced version ≥ i − η and trains at step i.
    """

    name = "nemo_in_order"
    strict = True
    Params = NemoLookaheadParams
    window_param = "max_lookahead_versions"

    def make_admission(self, group: Group) -> Admission:
        target = planned_batch_index(group, self.B)
        return Admission(group.uid, group.prompt_id, group.admit_version, priority=float(group.seq), planned_step=target)

    def choose_batch(self, step: int, now: float) -> Decision:
        # Upstream's evict is keyed on target_step, as select is: a ready group whose step has passed
        # can never be selected. Our trainer never passes step k without batch k, so this is a guard.
        past = [g for g in self.done if g.planned_step is not None and g.planned_step < step]
        return Decision(drop=drop_all(self, past, "nemo_evict_stale"), train=bound_batch(self, step))
