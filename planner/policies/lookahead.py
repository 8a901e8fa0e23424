"""`lookahead`: strict staleness bound η with zero drops (docs/design.md §2).

Each admitted group g gets the window [a(g), a(g)+η] — a(g) the version the workers hold when it
is admitted, a lower bound of every token's version since weights only move forward — and the
deadline d(g) = a(g)+η. The planner keeps the EDF condition (F) of `planner.feasibility` true:

- L1 admission: a new group (deadline d = synced+η) is admitted only while (F) still holds with
  it and |U|+1 <= B·(a+η−k+1), a = synced — the quota of docs/design.md §2. (With deadlines refined past
  a+η, (F) alone would admit more groups on an old synced version; with drain syncs and uneven
  workers the extra volume delays syncs and costs throughput at η=4, so the quota keeps it.)
  The run admits at most B·S groups in all, so every admitted group is trained by the last step.
  `max_untrained_groups` (>= B) caps |U| below that quota: when the trainer is the bottleneck a
  greedy quota fills up with done groups that wait η steps, so tokens train at staleness ≈ η;
  admitting just enough to keep the trainer busy trains them fresher at the same throughput
  (docs/tuning.md). It only lowers the quota, so (F) and strictness are untouched.
- L3 selection: the B done groups with the earliest deadline (ties: earlier completion, uid — the
  output-queue order NeMo-RL's samplers use; it measured 0.1-0.5% better than admission order), kept
  only if (F) holds for the rest at step k+1; otherwise the trainer waits — and then every batch
  of done groups would fail (F) too (exchange argument), so the wait is forced.
- The schedule: admission binds a group to the earliest step of its window with room (NeMo-RL
  `in_order`'s binding); at batch time done groups are pulled forward and unfinished ones move to
  the freed steps inside their windows. Every change is a `Move` (ledger `move`).
- Engine priority = deadline (earliest first) instead of L2 cancellation: nothing is cancelled.
- A group that starts on weights newer than it was admitted on — it waited in a slot-limited
  engine's queue, or a faster worker synced first — gets the later deadline start+η
  (`refine_on_start`): a relaxation of (F), so still strict.
- Faults: a resumed or regenerated group is re-admitted with a start barrier (Admission.version)
  at its first start version (or the synced version, if later): the driver must not run it on
  older weights, so its tokens keep the lower bound its window was refined to, and its deadline
  can only move later (a relaxation again).

With η = null (unbounded) it admits up to B·S groups at once and trains in completion order:
the async throughput ceiling of the benchmark.

The tail (docs/design.md §2.14): the in-flight (running or queued) groups with deadline <= k are
the ones batch k cannot do without — nothing here drops, so each must be trained by step k. Let
k be the step whose batch the trainer needs next: the step `select_batch(step=k)` could not train
(the trainer waits), or k+1 once batch k is chosen (the trainer trains k and needs k+1 next:
marking then, not only once it waits, gives the straggler the whole of step k's training to
catch up; measured in benchmarks/results/tail.md). The policy names those groups in
`Decision.critical` (an engine with `speculation.when=critical` speculates them) and, with
`policy.migrate=true`, the running ones also in `Decision.migrate` (the driver moves each to a
less loaded replica, if there is one). A group bound to k that starts later (it was queued, or
admitted after the mark) is marked at its start. And a deadline class's stragglers: once at most
`policy.tail_fraction` of the untrained groups with deadline d are still in flight (the rest are
done), the ones left are the groups that will bind step d — marked when the class's finishes
report it, before step d is the one needed (at η > 1 that is steps earlier). Each uid is named at most once per attempt in
each list (a lost group's re-admission is a new attempt), so a group never ping-pongs between
replicas. The rule reads only the events the driver reports: clock-free and synchronous.

Why neither decision can break the bound: speculation and migration change *how fast* a group's
tokens come, never the version of a token. Kept tokens keep their versions (a migrated prefix
moves with its versions; the ledger's `migrate` line lists them and the audit checks that the
trained group still holds them). New tokens are sampled on weights >= a(g): speculative sampling
emits the policy's own tokens at the engine's current version, and a migration target must hold
weights at least the group's start barrier / current version, as a re-admission's does
(`Admission.version`), so every token's version stays in [a(g), d(g)] and d(g) - a(g) <= η.
Neither changes a deadline, the counts of (F) or the plan, so L1 and L3 argue as before.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from planner.base import Group, PolicyBase
from planner.configs import check
from planner.feasibility import admission_room, feasible
from planner.predictors import make_predictor
from planner.registry import register
from planner.types import Admission, Candidate, Decision, GroupState, Move, Versions


@dataclass(frozen=True)
class LookaheadParams:
    """The planner's parameters (`policy.<name>`); η is the run's max_staleness.

    Attributes:
        predictor: none | history | oracle: a length predictor, for the admission order only
            (longest predicted first).
        refine_on_start: a group that starts on newer weights than it was admitted on gets the
            later deadline start + η.
        max_inflight_groups: engine-side cap on generating groups; may only lower the (F) quota.
        kv_token_budget: cap on predicted tokens in flight (needs a predictor).
        max_untrained_groups: cap on |U| (admitted, untrained groups), >= B; below the quota's
            B·(η + 1) it admits just enough to keep the trainer busy, so a trainer-bound run
            trains fresher tokens.
        migrate: also ask the driver to migrate the groups the waiting trainer needs to a less
            loaded replica (Decision.migrate), each at most once per attempt; critical marks are
            always sent.
        tail_fraction: a deadline class's in-flight groups are its stragglers, marked critical,
            once at most this share of its untrained groups is left, in [0, 1] (0: only the next
            batch's groups).
    """

    predictor: str = "none"
    refine_on_start: bool = True
    max_inflight_groups: int | None = None
    kv_token_budget: int | None = None
    max_untrained_groups: int | None = None
    migrate: bool = False
    tail_fraction: float = 0.75

    def __post_init__(self) -> None:
        for name in ("max_inflight_groups", "kv_token_budget", "max_untrained_groups"):
            v = getattr(self, name)
            check(v is None or v > 0, f"policy.{name}", v, "must be positive or null")
        check(0 <= self.tail_fraction <= 1, "policy.tail_fraction", self.tail_fraction, "must be in [0, 1]")


@register
class Lookahead(PolicyBase):
    """Our planner. `max_staleness` is used as η directly; there is no other knob to map."""

    name = "lookahead"
    strict = True
    Params = LookaheadParams

    def __init__(self, ctx, params: LookaheadParams | None = None) -> None:
        super().__init__(ctx, params)
        cap = self.params.max_untrained_groups
        # Below B no batch ever completes: the run would wait forever instead of failing here.
        check(cap is None or cap >= self.B, "policy.max_untrained_groups", cap,
              f"must be >= batch_groups={self.B} (a step trains B groups), or null")
        self.predictor = make_predictor(self.params.predictor)
        self.counts: dict[int, int] = {}  # deadline -> untrained groups with that deadline
        self.plan: dict[int, set[int]] = {}  # step -> uids planned for it
        self._ready: list[tuple[int, int, int]] = []  # heap of DONE groups: (deadline, finish_seq, uid)
        self._inflight_tokens = 0.0  # predicted tokens of in-flight groups
        self._moves: list[Move] = []  # re-planning done while admitting, returned with the admissions
        self._needed: int | None = None  # the step whose batch the trainer needs next (see the docstring)
        self._marked: set[int] = set()  # uids named in Decision.critical in their current attempt
        self._migrated: set[int] = set()  # uids named in Decision.migrate in their current attempt

    # ------------------------------------------------------------------ L1
    def admission_quota(self, now: float) -> int:
        quota = self.B * self.ctx.total_steps - self.admitted_total
        if self.eta is not None:
            k = self.next_batch_step
            quota = min(quota, admission_room(self.counts, k, self.B, self.synced + self.eta),
                        self.B * (self.synced + self.eta - k + 1) - self.untrained)
        if self.params.max_inflight_groups is not None:
            quota = min(quota, self.params.max_inflight_groups - self.inflight)
        if self.params.max_untrained_groups is not None:
            quota = min(quota, self.params.max_untrained_groups - self.untrained)
        return max(0, quota)

    def predict(self, c: Candidate) -> float | None:
        return self.predictor.predict(c)

    def order_candidates(self, candidates: Sequence[Candidate]) -> Sequence[Candidate]:
        """Longest predicted first; a candidate passed over for a whole window goes first (no starvation)."""
        if self.params.predictor == "none" or len(candidates) < 2:
            return candidates
        oldest_allowed = max(c.uid for c in candidates) - 2 * len(candidates)
        fallback = self.predictor.predict(Candidate(-1, "")) or 0.0

        def key(c: Candidate) -> tuple[int, float, int]:
            p = self.predictor.predict(c)
            return (0 if c.uid < oldest_allowed else 1, -(fallback if p is None else p), c.uid)

        return sorted(candidates, key=key)

    def admit(self, *, now: float, candidates: Sequence[Candidate]) -> Decision:
        quota = min(self.admission_quota(now), len(candidates))
        if quota <= 0:
            return Decision()
        budget = self.params.kv_token_budget
        chosen: list[Candidate] = []
        planned = self._inflight_tokens
        for c in self.order_candidates(candidates)[:quota]:
            tokens = (self.predict(c) or 0.0) * self.ctx.group_size
            # An idle engine always takes one group, however long, so the budget cannot stall a run.
            if budget is not None and (chosen or self.inflight) and planned + tokens > budget:
                break
            planned += tokens
            chosen.append(c)
        admissions = [self._admit_one(c) for c in chosen]
        moves, self._moves = self._moves, []
        return Decision(admit=admissions, moves=moves)

    def make_admission(self, g: Group) -> Admission:
        self._inflight_tokens += (g.predicted_tokens or 0.0) * self.ctx.group_size
        if self.eta is None:
            return Admission(g.uid, g.prompt_id, g.admit_version, priority=float(g.seq))
        d = g.admit_version + self.eta
        self.counts[d] = self.counts.get(d, 0) + 1
        g.deadline = d
        step = self._first_open_step(self.next_batch_step, d)
        if step is None:
            # Steps up to d are taken by groups whose deadlines were refined past d; (F) holds,
            # so the EDF re-plan fits everyone (they move later, inside their windows).
            self._moves += [m for m in self._replan_all(self.next_batch_step, [g]) if m.uid != g.uid]
        else:
            self.plan.setdefault(step, set()).add(g.uid)
            g.planned_step = step
        return Admission(g.uid, g.prompt_id, g.admit_version, d, priority=float(d), planned_step=g.planned_step)

    def _first_open_step(self, lo: int, hi: int) -> int | None:
        for s in range(lo, hi + 1):
            if len(self.plan.get(s, ())) < self.B:
                return s
        return None

    # ------------------------------------------------------------------ generation events
    def on_group_started(self, *, uid: int, version: int, now: float) -> Decision:
        g = self.groups.get(uid)
        first_start = g is not None and g.status == GroupState.QUEUED and g.start_version is None
        super().on_group_started(uid=uid, version=version, now=now)
        if first_start and self.eta is not None and self.params.refine_on_start:
            self._set_deadline(g, version + self.eta)
        if self._needed is not None and g is not None and g.deadline is not None and g.deadline <= self._needed:
            return self._tail([g])  # bound to the step the trainer needs next, and started late
        return Decision()

    def _tail(self, groups: Sequence[Group]) -> Decision:
        """The critical marks (and migrations) for `groups`, bound to the step the trainer needs
        next; each uid once per attempt."""
        critical = [g.uid for g in groups if g.uid not in self._marked]
        self._marked.update(critical)
        migrate: list[int] = []
        if self.params.migrate:
            migrate = [g.uid for g in groups if g.status == GroupState.RUNNING and g.uid not in self._migrated]
            self._migrated.update(migrate)
        return Decision(critical=critical, migrate=migrate)

    def _bound_to(self, step: int) -> list[Group]:
        """In-flight groups with deadline <= step: batch `step` cannot do without them."""
        return [g for g in self.groups.values()
                if g.status <= GroupState.RUNNING and g.deadline is not None and g.deadline <= step]

    def on_group_lost(self, *, uid: int, prefix_kept: bool, now: float) -> Decision:
        self._marked.discard(uid)  # its re-admission is a new attempt, on an engine that has not marked it
        self._migrated.discard(uid)
        return super().on_group_lost(uid=uid, prefix_kept=prefix_kept, now=now)

    def _set_deadline(self, g: Group, deadline: int) -> None:
        """Move g to a later deadline (never earlier: that could break (F))."""
        if g.deadline is None or deadline <= g.deadline:
            return
        self.counts[g.deadline] -= 1
        if not self.counts[g.deadline]:
            del self.counts[g.deadline]
        self.counts[deadline] = self.counts.get(deadline, 0) + 1
        g.deadline = deadline

    def on_group_finished(
        self, *, uid: int, versions: Versions, now: float, last_versions: Sequence[int] = ()
    ) -> Decision:
        g = self.groups.get(uid)
        was_inflight = g is not None and g.status in (GroupState.QUEUED, GroupState.RUNNING)
        super().on_group_finished(uid=uid, versions=versions, now=now, last_versions=last_versions)
        if was_inflight:
            self._marked.discard(uid)
            self._migrated.discard(uid)
            self._inflight_tokens -= (g.predicted_tokens or 0.0) * self.ctx.group_size
            self.predictor.observe(g.prompt_id, g.tokens / self.ctx.group_size)
            if g.deadline is not None:
                heapq.heappush(self._ready, (g.deadline, g.finish_seq, uid))
                return self._stragglers(g.deadline)
        return Decision()

    def _stragglers(self, deadline: int) -> Decision:
        """The tail marks of deadline class `deadline` once its in-flight groups are stragglers."""
        share = self.params.tail_fraction
        if not share:
            return Decision()
        left = [h for h in self.groups.values() if h.deadline == deadline and h.status <= GroupState.RUNNING]
        if not left or len(left) > share * self.counts.get(deadline, 0):
            return Decision()
        return self._tail(left)

    def readmission(self, group: Group, prefix_kept: bool) -> Admission:
        if self.eta is not None:
            if self.params.refine_on_start and group.start_version is not None:
                group.admit_version = max(group.admit_version, group.start_version)  # the barrier
            self._set_deadline(group, group.admit_version + self.eta)
        priority = float(group.deadline if group.deadline is not None else group.seq)
        return Admission(group.uid, group.prompt_id, group.admit_version, group.deadline, priority, group.planned_step)

    # ------------------------------------------------------------------ L3
    def choose_batch(self, step: int, now: float) -> Decision:
        decision = self._choose_batch(step)
        if self.eta is None:
            return decision
        # The trainer waits for batch `step`, or trains it and needs batch step+1 next.
        self._needed = step if decision.train is None else step + 1
        tail = self._tail(self._bound_to(self._needed))
        decision.critical, decision.migrate = tail.critical, tail.migrate
        return decision

    def _choose_batch(self, step: int) -> Decision:
        if self.num_done < self.B:
            return Decision()  # forced: fewer than B groups are done
        if self.eta is None:
            uids = [uid for uid, _ in zip(self._done, range(self.B))]  # completion order
            return Decision(train=uids)
        batch = [heapq.heappop(self._ready) for _ in range(self.B)]
        rest = dict(self.counts)
        for d, _, _ in batch:
            rest[d] -= 1
        if not feasible(rest, step + 1, self.B):
            for entry in batch:  # forced: the EDF batch fails (F), so every batch does
                heapq.heappush(self._ready, entry)
            return Decision()
        self.counts = {d: c for d, c in rest.items() if c}
        uids = [uid for _, _, uid in batch]
        return Decision(train=uids, moves=self._replan(step, uids))

    def _replan(self, step: int, batch: list[int]) -> list[Move]:
        """Make step `step` hold exactly `batch`; displaced groups take the freed later steps."""
        planned_here = self.plan.pop(step, set())
        chosen = set(batch)
        moves: list[Move] = []
        freed: list[int] = []
        for uid in batch:
            g = self.groups[uid]
            if g.planned_step != step:
                self.plan[g.planned_step].discard(uid)
                freed.append(g.planned_step)
                moves.append(self.move(g, step))
        displaced = sorted((self.groups[u] for u in planned_here - chosen), key=lambda g: (g.deadline, g.seq))
        freed.sort()
        if all(s <= g.deadline for g, s in zip(displaced, freed)):
            for g, s in zip(displaced, freed):
                self.plan[s].add(g.uid)
                moves.append(self.move(g, s))
        else:
            for g in displaced:
                g.planned_step = None
            moves += self._replan_all(step + 1, displaced)
        for s in [s for s, uids in self.plan.items() if not uids]:
            del self.plan[s]
        return moves

    def _replan_all(self, start: int, unplanned: list[Group]) -> list[Move]:
        """EDF assignment of every untrained group from `start` (exists because (F) holds)."""
        groups = sorted(
            [self.groups[u] for uids in self.plan.values() for u in uids] + unplanned,
            key=lambda g: (g.deadline, g.seq),
        )
        self.plan = {}
        moves = []
        for i, g in enumerate(groups):
            s = start + i // self.B
            assert s <= g.deadline, f"(F) held but EDF puts group {g.uid} (deadline {g.deadline}) at step {s}"
            self.plan.setdefault(s, set()).add(g.uid)
            if g.planned_step != s:
                moves.append(self.move(g, s))
        return moves

    # ------------------------------------------------------------------ checkpoints
    def extra_state(self) -> dict[str, Any]:
        return {
            "counts": [[d, c] for d, c in self.counts.items()],
            "plan": [[s, sorted(uids)] for s, uids in self.plan.items()],
            "predictor": self.predictor.state_dict(),
            "inflight_tokens": self._inflight_tokens,
            "tail": {"needed": self._needed, "marked": sorted(self._marked), "migrated": sorted(self._migrated)},
        }

    def load_extra_state(self, state: Mapping[str, Any]) -> None:
        self.predictor = make_predictor(self.params.predictor)
        self.predictor.load_state_dict(state["predictor"])
        self.counts = {int(d): int(c) for d, c in state["counts"]}
        self.plan = {int(s): set(uids) for s, uids in state["plan"]}
        self._inflight_tokens = state["inflight_tokens"]
        tail = state.get("tail", {})  # absent in checkpoints written before the tail rule
        self._needed = tail.get("needed")
        self._marked, self._migrated = set(tail.get("marked", ())), set(tail.get("migrated", ()))
        self._ready = [(g.deadline, g.finish_seq, g.uid) for g in self._done.values() if g.deadline is not None]
        heapq.heapify(self._ready)
