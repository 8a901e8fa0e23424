"""The policy contract and the bookkeeping every policy shares.

A *policy* decides the three control points of docs/design.md §1: which groups start (L1 admission),
which running groups are cancelled (L2), and which done groups form batch `k` (L3). It is
synchronous and never reads a clock — the driver passes `now` — so the very same object runs in
the discrete-event simulator and in the real runtime.

Event protocol (the driver calls these; each returns a `Decision` to apply):

    admit(now, candidates)                 may admit some candidates (L1)
    on_group_started(uid, version, now)    the engine started the group on weights `version`
    on_tokens(uid, version, tokens, now)   `tokens` more tokens were sampled on `version`
                                           (partial rollout reports these at weight updates)
    on_group_finished(uid, versions, now)  generation ended; `versions` = [(v, tokens), ...]
    on_version_published(version, now)     the trainer published weights `version`
    on_version_synced(version, now)        every live worker now holds >= `version`
    on_engine_stats(kv_usage, queued, now) engine load report (prime-rl's adaptive cap reads it)
    select_batch(step, now)                the trainer is idle at step `step` (L3)
    on_step_done(step, now)                step `step` finished (the next publish follows)
    on_group_lost(uid, prefix_kept, now)   a worker died; the group must be resumed
                                           (prefix kept) or regenerated
    finish(now)                            the run ends: untrained groups are dropped
                                           (`end_of_run`) — a no-drop policy has none

How to add a policy: subclass `PolicyBase`, declare a frozen `Params` dataclass with the
framework's own parameter names, each typed and documented in its docstring's `Attributes:`
section (`build` types `policy.<name>` against the annotation; `--help` shows the text), map the
common `max_staleness` onto them in `default_params`, override the hooks that differ
(`admission_quota`, `order_candidates`, `make_admission`, `choose_batch`,
`on_version_published`, ...) and register the class in `planner.registry`. Shared L1/L2/L3 rules
live in `planner.policies.blocks`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol, runtime_checkable

from planner import configs
from planner.types import Admission, Candidate, Decision, Drop, GroupState, Move, PlanContext, Versions


@runtime_checkable
class Policy(Protocol):
    """What a driver needs from a policy. `PolicyBase` implements it."""

    name: ClassVar[str]
    strict: ClassVar[bool]

    def staleness_bound(self) -> int | None: ...

    def admit(self, *, now: float, candidates: Sequence[Candidate]) -> Decision: ...
    def on_group_started(self, *, uid: int, version: int, now: float) -> Decision: ...
    def on_tokens(self, *, uid: int, version: int, tokens: int, now: float) -> Decision: ...
    def on_group_finished(
        self, *, uid: int, versions: Versions, now: float, last_versions: Sequence[int] = ()
    ) -> Decision: ...
    def on_version_published(self, *, version: int, now: float) -> Decision: ...
    def on_version_synced(self, *, version: int, now: float) -> Decision: ...
    def on_engine_stats(self, *, kv_usage: float, queued: int, now: float) -> Decision: ...
    def select_batch(self, *, step: int, now: float) -> Decision: ...
    def on_step_done(self, *, step: int, now: float) -> Decision: ...
    def on_group_lost(self, *, uid: int, prefix_kept: bool, now: float) -> Decision: ...
    def finish(self, *, now: float) -> Decision: ...
    def state_dict(self) -> dict[str, Any]: ...
    def load_state_dict(self, state: Mapping[str, Any]) -> None: ...


@dataclass(slots=True)
class Group:
    """One admitted group as the policy sees it."""

    uid: int
    prompt_id: int | str
    seq: int  # admission order (FIFO tie-break)
    admit_version: int  # a(g): lower bound of every token's version
    admit_step: int  # trainer step at admission (verl's `global_steps`)
    status: GroupState = GroupState.QUEUED
    start_version: int | None = None  # weights the engine held when it started
    deadline: int | None = None
    planned_step: int | None = None
    versions: dict[int, int] = dataclasses.field(default_factory=dict)  # version -> tokens
    last_versions: tuple[int, ...] = ()  # version of each trajectory's last token
    finish_seq: int | None = None  # completion order
    predicted_tokens: float | None = None

    @property
    def tokens(self) -> int:
        return sum(self.versions.values())

    @property
    def min_version(self) -> int:
        """Earliest generation version of any token (prime-rl's `policy.start`)."""
        if self.versions:
            return min(self.versions)
        return self.start_version if self.start_version is not None else self.admit_version

    def to_json(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["status"] = int(self.status)
        d["versions"] = [[v, t] for v, t in self.versions.items()]
        d["last_versions"] = list(self.last_versions)
        return d

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Group:
        d = dict(d)
        d["status"] = GroupState(d["status"])
        d["versions"] = {int(v): int(t) for v, t in d["versions"]}
        d["last_versions"] = tuple(d["last_versions"])
        return cls(**d)


@dataclass(frozen=True)
class NoParams:
    """For policies without native parameters."""


class PolicyBase:
    """Shared state and event handling; subclasses override only what differs."""

    name: ClassVar[str] = ""
    strict: ClassVar[bool] = False  # the reference's "strict" column
    Params: ClassVar[type] = NoParams

    def __init__(self, ctx: PlanContext, params: Any | None = None) -> None:
        self.ctx = ctx
        self.params = params if params is not None else self.typed_params(self.default_params(ctx))
        self.groups: dict[int, Group] = {}
        self.step = 0  # the trainer's current step (= trainer version)
        self.batch_pending = False  # batch `step` is chosen and training; cleared by on_step_done
        self.published = 0  # newest published version
        self.synced = 0  # version every live worker holds
        self.admitted_total = 0  # admissions ever, re-admissions after faults excluded
        self.trained_total = 0
        self.dropped_total = 0
        self._seq = 0
        self._finish_seq = 0
        self._inflight = 0  # QUEUED + RUNNING
        self._done: dict[int, Group] = {}  # DONE, insertion = completion order

    # ----------------------------------------------------------------- construction
    @classmethod
    def default_params(cls, ctx: PlanContext) -> dict[str, Any]:
        """Native parameters derived from the common `max_staleness` (documented per policy)."""
        return {}

    @classmethod
    def build(cls, ctx: PlanContext, overrides: Mapping[str, Any] | None = None) -> PolicyBase:
        """Make the policy from the common context plus `policy.<native name>` overrides.

        A parameter absent from `overrides` (or left `???`) takes the policy's default:
        `default_params` (derived from max_staleness) over the Params dataclass's own. A parameter
        present is that value, None included: null is a value of the parameters whose type admits
        it (torchtitan's `window_fraction: null` is strict FIFO, not the default 0.3) and an error
        for the others, so "not given" and "null" never mean the same thing
        (`planner.registry.given_params`). `planner.configs.build` checks the keys and the types
        (`policy.migrate='no': must be true or false`) before the Params' own rules run.
        """
        return cls(ctx, cls.typed_params({**cls.default_params(ctx), **configs.given(overrides)}))

    @classmethod
    def typed_params(cls, values: Mapping[str, Any]) -> Any:
        """`values` as the Params dataclass, through the builder every config section uses: an
        unknown key, a value of the wrong type or a broken rule is one line naming `policy.<key>`."""
        return configs.build(cls.Params, values, "policy", what=f"parameter of policy '{cls.name}'")

    # ----------------------------------------------------------------- views
    @property
    def eta(self) -> int | None:
        return self.ctx.max_staleness

    @property
    def B(self) -> int:
        return self.ctx.batch_groups

    def staleness_bound(self) -> int | None:
        """The largest token staleness this policy lets into a batch, or None when it bounds none.

        Default: η for a strict policy, None otherwise. A policy that is strict at a looser
        bound than η (torchtitan's windowed FIFO: S + ⌈(W−1)/P⌉) overrides it. Tests, the
        benchmark and `planner.audit` calls that check a policy's own claim read it here, so
        the rule lives in one place.
        """
        return self.eta if self.strict else None

    @property
    def next_batch_step(self) -> int:
        """The first step whose batch is not chosen yet: where new groups can still go."""
        return self.step + 1 if self.batch_pending else self.step

    @property
    def inflight(self) -> int:
        """Admitted groups still generating (queued in an engine or running)."""
        return self._inflight

    @property
    def done(self) -> list[Group]:
        """Done, untrained groups in completion order."""
        return list(self._done.values())

    @property
    def num_done(self) -> int:
        return len(self._done)

    @property
    def untrained(self) -> int:
        """|U|: admitted groups neither trained nor dropped."""
        return self._inflight + len(self._done)

    # ----------------------------------------------------------------- hooks
    def admission_quota(self, now: float) -> int:
        """How many new groups may start now (L1). Default: no limit."""
        return 1 << 30

    def order_candidates(self, candidates: Sequence[Candidate]) -> Sequence[Candidate]:
        """Which candidates to admit first. Default: data-stream order."""
        return candidates

    def make_admission(self, group: Group) -> Admission:
        """Engine priority, deadline and plan of a newly admitted group. Default: FIFO."""
        return Admission(group.uid, group.prompt_id, group.admit_version, priority=float(group.seq))

    def choose_batch(self, step: int, now: float) -> Decision:
        """L3: the batch of `step` (and drops), or a Decision with train=None to wait."""
        raise NotImplementedError

    def extra_state(self) -> dict[str, Any]:
        return {}

    def load_extra_state(self, state: Mapping[str, Any]) -> None:
        pass

    # ----------------------------------------------------------------- helpers
    def drop(self, uid: int, reason: str) -> Drop:
        """Mark `uid` dropped and return the record the driver applies."""
        g = self.groups[uid]
        if g.status in (GroupState.QUEUED, GroupState.RUNNING):
            self._inflight -= 1
        elif g.status == GroupState.DONE:
            del self._done[uid]
        else:
            raise AssertionError(f"group {uid} dropped twice or after training (status {g.status.name})")
        g.status = GroupState.DROPPED
        del self.groups[uid]  # finished groups leave the table: memory and checkpoints stay O(|U|)
        self.dropped_total += 1
        return Drop(uid, self.step, reason)

    def train(self, uids: Iterable[int]) -> list[int]:
        """Mark done groups as batch `self.step`."""
        out = []
        for uid in uids:
            g = self._done.pop(uid)
            g.status = GroupState.TRAINED
            del self.groups[uid]
            out.append(uid)
        self.trained_total += len(out)
        return out

    def move(self, group: Group, dst: int) -> Move:
        src = group.planned_step
        group.planned_step = dst
        return Move(group.uid, -1 if src is None else src, dst)

    def take_oldest_first(self, groups: Iterable[Group], count: int) -> list[int]:
        """Oldest admission first — the common FIFO tie-breaker."""
        return [g.uid for g in sorted(groups, key=lambda g: (g.seq, g.uid))[:count]]

    # ----------------------------------------------------------------- events
    def admit(self, *, now: float, candidates: Sequence[Candidate]) -> Decision:
        quota = min(self.admission_quota(now), len(candidates))
        if quota <= 0:
            return Decision()
        chosen = self.order_candidates(candidates)[:quota]
        return Decision(admit=[self._admit_one(c) for c in chosen])

    def _admit_one(self, c: Candidate) -> Admission:
        if c.uid in self.groups:
            raise ValueError(f"candidate uid {c.uid} was already admitted")
        g = Group(c.uid, c.prompt_id, self._seq, self.synced, self.step)
        g.predicted_tokens = self.predict(c)
        self._seq += 1
        self.groups[c.uid] = g
        self._inflight += 1
        self.admitted_total += 1
        a = self.make_admission(g)
        g.deadline, g.planned_step = a.deadline, a.planned_step
        return a

    def predict(self, c: Candidate) -> float | None:
        """Predicted group length; only `lookahead` uses a predictor."""
        return None

    def on_group_started(self, *, uid: int, version: int, now: float) -> Decision:
        g = self.groups.get(uid)
        if g is not None and g.status == GroupState.QUEUED:
            g.status = GroupState.RUNNING
            if g.start_version is None:
                g.start_version = version
        return Decision()

    def on_tokens(self, *, uid: int, version: int, tokens: int, now: float) -> Decision:
        g = self.groups.get(uid)
        if g is None:
            return Decision()  # already dropped
        g.versions[version] = g.versions.get(version, 0) + tokens
        return Decision()

    def on_group_finished(
        self, *, uid: int, versions: Versions, now: float, last_versions: Sequence[int] = ()
    ) -> Decision:
        g = self.groups.get(uid)
        if g is None or g.status not in (GroupState.QUEUED, GroupState.RUNNING):
            return Decision()  # a cancelled group's late completion
        g.versions = {}
        for v, t in versions:
            g.versions[v] = g.versions.get(v, 0) + t
        g.last_versions = tuple(last_versions) or ((max(g.versions),) if g.versions else ())
        g.status = GroupState.DONE
        g.finish_seq = self._finish_seq
        self._finish_seq += 1
        self._inflight -= 1
        self._done[uid] = g
        return Decision()

    def on_version_published(self, *, version: int, now: float) -> Decision:
        self.published = max(self.published, version)
        return Decision()

    def on_version_synced(self, *, version: int, now: float) -> Decision:
        self.synced = max(self.synced, version)
        return Decision()

    def on_engine_stats(self, *, kv_usage: float, queued: int, now: float) -> Decision:
        """KV usage in [0, 1] summed over workers and requests waiting for a slot. Default: ignored."""
        return Decision()

    def select_batch(self, *, step: int, now: float) -> Decision:
        if step != self.step or self.batch_pending:
            raise ValueError(f"select_batch(step={step}) but the policy is at step {self.step} (batch chosen: {self.batch_pending})")
        decision = self.choose_batch(step, now)
        if decision.train is not None:
            if len(decision.train) != self.B:
                raise AssertionError(f"{self.name}: batch of {len(decision.train)} groups, expected {self.B}")
            decision.train = self.train(decision.train)
            self.batch_pending = True
        return decision

    def on_step_done(self, *, step: int, now: float) -> Decision:
        self.step = step + 1
        self.batch_pending = False
        return Decision()

    def on_group_lost(self, *, uid: int, prefix_kept: bool, now: float) -> Decision:
        """Resume (prefix kept: same admission) or regenerate (re-admitted at the synced version)."""
        g = self.groups.get(uid)
        if g is None or g.status not in (GroupState.QUEUED, GroupState.RUNNING):
            return Decision()
        g.status = GroupState.QUEUED
        if not prefix_kept:
            g.versions = {}
            g.admit_version = max(g.admit_version, self.synced)
            g.admit_step = self.step
        a = self.readmission(g, prefix_kept)
        g.admit_version, g.deadline, g.planned_step = a.version, a.deadline, a.planned_step
        if not prefix_kept:
            g.start_version = None  # it starts afresh
        return Decision(admit=[a])

    def readmission(self, group: Group, prefix_kept: bool) -> Admission:
        """The admission record of a resumed or regenerated group. Default: keep its place.

        `group.start_version` is still the version of its first start here (None if it never
        started); `group.admit_version` is already at least the synced version if regenerated.
        """
        return Admission(
            group.uid, group.prompt_id, group.admit_version, group.deadline, float(group.seq), group.planned_step
        )

    def finish(self, *, now: float) -> Decision:
        leftover = list(self.groups)  # the table holds only untrained groups
        return Decision(drop=[self.drop(uid, "end_of_run") for uid in leftover])

    # ----------------------------------------------------------------- checkpoints
    _SCALARS = ("step", "batch_pending", "published", "synced", "admitted_total", "trained_total", "dropped_total", "_seq", "_finish_seq")

    def state_dict(self) -> dict[str, Any]:
        return {
            "policy": self.name,
            "params": dataclasses.asdict(self.params),
            "scalars": {k: getattr(self, k) for k in self._SCALARS},
            "groups": [g.to_json() for g in self.groups.values()],
            "done_order": list(self._done),
            "extra": self.extra_state(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if state["policy"] != self.name:
            raise ValueError(f"checkpoint holds policy '{state['policy']}', this run uses '{self.name}'")
        self.params = self.typed_params(state["params"])
        for k, v in state["scalars"].items():
            setattr(self, k, v)
        self.groups = {}
        for d in state["groups"]:
            g = Group.from_json(d)
            self.groups[g.uid] = g
        self._done = {uid: self.groups[uid] for uid in state["done_order"]}
        self._inflight = sum(g.status in (GroupState.QUEUED, GroupState.RUNNING) for g in self.groups.values())
        self.load_extra_state(state["extra"])
