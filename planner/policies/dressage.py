"""Dressage: group caps (L1), a per-trajectory version-span abort (L2), an appearance-order
window on last-token versions (L3).

Reference "Dressage": at most `max_active_groups` generating, and admission pauses once the
output queue is 80% full. A partial rollout is aborted once it has used more than
`max_partial_rollout_preempts + 1` distinct versions. While a batch is collected from the output
queue, the tracker records each version label in the order it *first appears* among collected
results (never re-sorted, an old label seen again changes nothing) and keeps only the last
`dressage_staleness_keep_versions` labels; a group with any trajectory whose last-token version is
older is dropped — including groups already collected into the batch being built.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from planner.base import PolicyBase
from planner.configs import check
from planner.policies.blocks import by_completion, cap_room
from planner.registry import register
from planner.types import Decision, GroupState, PlanContext, Versions

OUTPUT_QUEUE_PAUSE = 0.8  # fraction of the output queue at which admission pauses


@dataclass(frozen=True)
class DressageParams:
    """Dressage's native parameters (`policy.<name>`).

    Attributes:
        max_active_groups: cap on generating groups; null: B·(η + 1).
        output_queue_size: the output queue in groups (admission pauses at 80% full); null: B·(η + 1).
        dressage_staleness_keep_versions: version labels kept by the L3 window; null or 0: filter
            off; not given: η + 1.
        max_partial_rollout_preempts: a group spanning more than this + 1 versions is aborted;
            null: no span limit; not given: η.
    """

    max_active_groups: int | None = None
    output_queue_size: int | None = None
    dressage_staleness_keep_versions: int | None = None
    max_partial_rollout_preempts: int | None = None

    def __post_init__(self) -> None:
        for name in ("max_active_groups", "output_queue_size"):
            v = getattr(self, name)
            check(v is None or v >= 1, f"policy.{name}", v, "must be >= 1 or null")
        k = self.dressage_staleness_keep_versions
        check(k is None or k >= 0, "policy.dressage_staleness_keep_versions", k, "must be an integer >= 0 or null")
        p = self.max_partial_rollout_preempts
        check(p is None or p >= 0, "policy.max_partial_rollout_preempts", p, "must be >= 0 or null")


@register
class Dressage(PolicyBase):
    """Dressage. Mapping from η: `dressage_staleness_keep_versions = η + 1`,
    `max_partial_rollout_preempts = η`; the two caps default to B·(η + 1) groups.

    L1: active < max_active_groups and done-untaken < 0.8·output_queue_size. L2 (`on_tokens` and
    at completion): drop a group whose tokens span more than preempts + 1 versions (counted over the
    group: the driver reports versions per group, not per trajectory, which can only abort more).
    L3: the appearance-order window above, batch filled in completion order. Not strict: only the
    last token is checked and the window follows labels, not the train version.
    """

    name = "dressage"
    strict = False
    Params = DressageParams

    def __init__(self, ctx: PlanContext, params: DressageParams | None = None) -> None:
        super().__init__(ctx, params)
        self.versions_seen: dict[int, int] = {}  # label -> position of first appearance among collected results
        self.collected: list[int] = []  # the batch being built

    @classmethod
    def default_params(cls, ctx: PlanContext) -> dict[str, Any]:
        eta = ctx.max_staleness
        if eta is None:
            return {}
        return {"dressage_staleness_keep_versions": eta + 1, "max_partial_rollout_preempts": eta}

    def _default_cap(self) -> int:
        lead = self.eta if self.eta is not None else 1
        return self.B * (lead + 1)

    def admission_quota(self, now: float) -> int:
        queue = self.params.output_queue_size or self._default_cap()
        if self.num_done >= OUTPUT_QUEUE_PAUSE * queue:
            return 0
        return cap_room(self.params.max_active_groups or self._default_cap(), self.inflight)

    # ------------------------------------------------------------------ L2
    def _span_exceeded(self, uid: int) -> bool:
        p = self.params.max_partial_rollout_preempts
        g = self.groups.get(uid)
        return p is not None and g is not None and len(g.versions) > p + 1

    def on_tokens(self, *, uid: int, version: int, tokens: int, now: float) -> Decision:
        super().on_tokens(uid=uid, version=version, tokens=tokens, now=now)
        g = self.groups.get(uid)
        if g is not None and g.status == GroupState.RUNNING and self._span_exceeded(uid):
            return Decision(drop=[self.drop(uid, "dressage_partial_rollout_preempts")])
        return Decision()

    def on_group_finished(
        self, *, uid: int, versions: Versions, now: float, last_versions: Sequence[int] = ()
    ) -> Decision:
        decision = super().on_group_finished(uid=uid, versions=versions, now=now, last_versions=last_versions)
        if uid in self._done and self._span_exceeded(uid):
            decision.drop.append(self.drop(uid, "dressage_partial_rollout_preempts"))
        return decision

    # ------------------------------------------------------------------ L3
    def _cutoff(self) -> int:
        keep = self.params.dressage_staleness_keep_versions
        if not keep:
            return 0
        return max(0, len(self.versions_seen) - keep)

    def _outside(self, uid: int) -> bool:
        cutoff = self._cutoff()
        return any(self.versions_seen[v] < cutoff for v in self.groups[uid].last_versions)

    def choose_batch(self, step: int, now: float) -> Decision:
        drops = []
        pending = [g for g in by_completion(self.done) if g.uid not in set(self.collected)]
        for g in pending:
            if len(self.collected) == self.B:
                break
            for v in g.last_versions:
                self.versions_seen.setdefault(v, len(self.versions_seen))
            for uid in [u for u in self.collected if self._outside(u)]:
                self.collected.remove(uid)
                drops.append(self.drop(uid, "dressage_keep_versions"))
            if self._outside(g.uid):
                drops.append(self.drop(g.uid, "dressage_keep_versions"))
            else:
                self.collected.append(g.uid)
        if len(self.collected) < self.B:
            return Decision(drop=drops)
        batch, self.collected = self.collected, []
        return Decision(drop=drops, train=batch)

    def extra_state(self) -> dict[str, Any]:
        return {"versions_seen": list(self.versions_seen), "collected": list(self.collected)}  # keys in order

    def load_extra_state(self, state: Mapping[str, Any]) -> None:
        self.versions_seen = {int(v): i for i, v in enumerate(state["versions_seen"])}
        self.collected = [int(u) for u in state["collected"]]
