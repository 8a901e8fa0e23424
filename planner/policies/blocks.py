"""Shared L1/L2/L3 building blocks of the baseline policies (docs/design.md §3, reference Part II).

The sixteen baselines differ in a handful of rules, each used by several frameworks. They live
here once, as small functions over a `PolicyBase`'s bookkeeping, so that every policy class is a
short list of "which rule at L1, which at L2, which at L3":

- L1 quotas: `cumulative_room` (verl, AReaL, SkyRL, ROLL, NeMo-RL's gated samplers and our
  lookahead: admissions ever ≤ lead + (progress + 1)·B, drops re-admitted), `cap_room` (in-flight
  and buffer caps, batch permits).
- L2 cancellation: `running_groups` + `older_than` + `drop_all`.
- L3: orders (`by_completion`, `by_admission`, `by_version`), `first_batch` (take B or wait) and
  `bound_batch` (the batch planned for this step, all done, or wait).

How to add a rule: write it as a function of the policy's state that returns numbers, groups or
drops — never mutate state other than through `PolicyBase.drop` / `PolicyBase.train`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from planner.base import Group, PolicyBase
from planner.types import Drop, GroupState

UNLIMITED = 1 << 30


# ------------------------------------------------------------------------------------- L1
def cumulative_room(policy: PolicyBase, *, lead_groups: int, progress: int) -> int:
    """Groups that may still start under a cumulative batch quota.

    admitted_ever ≤ lead_groups + (progress + 1)·B + dropped_ever. The quota grows by one batch
    per unit of `progress` (trainer step or synced version, per framework); finishing a group frees
    nothing (AReaL: running → accepted keeps the sum). Dropped groups are re-admitted, as verl's
    buffer does after its L3 filter, so a dropping policy never starves.
    """
    limit = lead_groups + (progress + 1) * policy.B + policy.dropped_total
    return limit - policy.admitted_total


def cap_room(cap: int | None, used: int) -> int:
    """Room under a cap (None = no cap)."""
    return UNLIMITED if cap is None else cap - used


def batch_lead(batch_groups: int, ratio: float) -> int:
    """ROLL's extra first-round quota ceil(B·ratio)."""
    return math.ceil(batch_groups * ratio)


# ------------------------------------------------------------------------------------- L2
def running_groups(policy: PolicyBase) -> list[Group]:
    """Groups that are generating now (a queued group has no version yet: never cancelled)."""
    return [g for g in policy.groups.values() if g.status == GroupState.RUNNING]


def older_than(groups: Iterable[Group], min_version: int) -> list[Group]:
    """Groups whose earliest token version (start version while running) is below `min_version`."""
    return [g for g in groups if g.min_version < min_version]


def inflight_groups(policy: PolicyBase) -> list[Group]:
    """Groups queued in an engine or generating: everything dispatched and not yet done."""
    return [g for g in policy.groups.values() if g.status in (GroupState.QUEUED, GroupState.RUNNING)]


def dispatched_before(groups: Iterable[Group], min_version: int) -> list[Group]:
    """Groups dispatched (admitted) on weights below `min_version`: samplers that tag a group's
    version at dispatch (NeMo-RL's buffer slot, tinker's sampling client) read `admit_version`,
    so a request still queued in an engine carries a version too."""
    return [g for g in groups if g.admit_version < min_version]


def drop_all(policy: PolicyBase, groups: Iterable[Group], reason: str) -> list[Drop]:
    return [policy.drop(g.uid, reason) for g in list(groups)]


# ------------------------------------------------------------------------------------- L3
def by_completion(groups: Iterable[Group]) -> list[Group]:
    """Queue order: the order generation finished (FIFO output queues)."""
    return sorted(groups, key=lambda g: (g.finish_seq if g.finish_seq is not None else -1, g.uid))


def by_admission(groups: Iterable[Group]) -> list[Group]:
    """Oldest admission first (verl's buffer order)."""
    return sorted(groups, key=lambda g: (g.seq, g.uid))


def by_version(groups: Iterable[Group]) -> list[Group]:
    """Oldest earliest-token version first, then completion order (ROLL)."""
    return sorted(groups, key=lambda g: (g.min_version, g.finish_seq if g.finish_seq is not None else -1, g.uid))


def first_batch(ordered: Iterable[Group], batch_groups: int) -> list[int] | None:
    """The first B groups, or None (wait) when fewer than B are there."""
    uids = [g.uid for g in ordered][:batch_groups]
    return uids if len(uids) == batch_groups else None


def bound_batch(policy: PolicyBase, step: int) -> list[int] | None:
    """The groups planned for `step` (NeMo-RL in_order, OpenRLHF's batch queue), once all are done."""
    return first_batch((g for g in policy.done if g.planned_step == step), policy.B)


def planned_batch_index(group: Group, batch_groups: int) -> int:
    """Dispatch batch of a group admitted `seq`-th: the i-th B admissions form batch i."""
    return group.seq // batch_groups
