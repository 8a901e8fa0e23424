"""A small scripted driver for policy tests: the test decides every event, the driver keeps the
books (which groups run, their token versions, what was trained at which step) and applies each
`Decision` through `planner.driver.apply_decision`, as the simulator and the runtime do. No clock,
no engine model.

    d = ScriptedDriver(policy)            # offers candidates and admits right away
    d.start(uid); d.tokens(uid, 5); d.finish(uid)
    d.train_step()                        # select_batch → on_step_done → publish (→ sync)

`partial=True` makes generation continue across weight syncs: tokens after a sync carry the new
version. `random_run` drives a policy with random completion orders for property tests.
"""

from __future__ import annotations

import random
from collections.abc import Iterable
from dataclasses import dataclass, field

from planner.base import PolicyBase
from planner.driver import apply_decision
from planner.types import Admission, Candidate, Decision, Drop, GroupState, Move


class Deadlock(AssertionError):
    """Nothing is generating, the trainer cannot form a batch and the policy admits nothing."""


@dataclass
class Trained:
    step: int
    uid: int
    versions: dict[int, int]

    @property
    def staleness(self) -> int:
        return self.step - min(self.versions)


@dataclass
class ScriptedDriver:
    policy: PolicyBase
    autostart: bool = True  # start each admitted group at once on the synced version
    partial: bool = False  # partial rollout: tokens after a sync are generated on the new version
    auto_sync: bool = True  # sync each published version at once
    offer: int = 64  # candidates offered per admission call
    step: int = 0  # next trainer step
    published: int = 0
    synced: int = 0
    admitted: list[int] = field(default_factory=list)
    admit_versions: dict[int, int] = field(default_factory=dict)
    queued: list[int] = field(default_factory=list)
    running: dict[int, dict[int, int]] = field(default_factory=dict)  # uid -> version -> tokens
    start_versions: dict[int, int] = field(default_factory=dict)
    done: dict[int, dict[int, int]] = field(default_factory=dict)
    trained: list[Trained] = field(default_factory=list)
    batches: list[list[int]] = field(default_factory=list)
    dropped: dict[int, str] = field(default_factory=dict)
    trace: list[tuple] = field(default_factory=list)  # (policy method, decision), for replay comparisons
    _next_uid: int = 0
    _pending: list[Candidate] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.admit()

    # ------------------------------------------------------------------ plumbing
    def _apply(self, call: str, decision: Decision) -> Decision:
        self.trace.append(
            (
                call,
                [(a.uid, a.version, a.deadline, a.planned_step) for a in decision.admit],
                [(d.uid, d.step, d.reason) for d in decision.drop],
                decision.train,
            )
        )
        apply_decision(self, decision, call=call, policy=self.policy.name)
        if self.autostart:  # once the whole decision is applied, in admission order
            for a in decision.admit:
                self.start(a.uid, readmit=False)
        return decision

    # The DecisionHost hooks (planner.driver).
    def held(self, uid: int) -> GroupState | None:
        if uid in self.done:
            return GroupState.DONE
        if uid in self.running:
            return GroupState.RUNNING
        if uid in self.queued:
            return GroupState.QUEUED
        return GroupState.CANDIDATE if any(c.uid == uid for c in self._pending) else None

    def record_moves(self, moves: list[Move]) -> None:
        pass  # no ledger

    def mark_critical(self, uids: list[int]) -> None:
        pass  # one engine that never speculates

    def migrate_groups(self, uids: list[int]) -> None:
        pass  # one engine: nowhere to move to

    def drop_group(self, d: Drop) -> None:
        self.dropped[d.uid] = d.reason
        if d.uid in self.queued:
            self.queued.remove(d.uid)
        self.running.pop(d.uid, None)
        self.done.pop(d.uid, None)

    def train_batch(self, uids: list[int]) -> None:
        for uid in uids:
            self.trained.append(Trained(self.step, uid, self.done.pop(uid)))
        self.batches.append(list(uids))

    def admit_group(self, a: Admission) -> None:
        self._pending = [c for c in self._pending if c.uid != a.uid]
        self.admitted.append(a.uid)
        self.admit_versions[a.uid] = a.version
        self.queued.append(a.uid)

    def admit(self) -> list[int]:
        """Offer the next candidates of the data stream (skipped ones first), `offer` at a time,
        until the policy takes fewer than offered; return the admitted uids."""
        admitted: list[int] = []
        while True:
            while len(self._pending) < self.offer:
                self._pending.append(Candidate(self._next_uid, prompt_id=self._next_uid))
                self._next_uid += 1
            decision = self._apply("admit", self.policy.admit(now=0.0, candidates=list(self._pending)))
            admitted += [a.uid for a in decision.admit]
            if len(decision.admit) < self.offer:
                return admitted

    def _event(self, call: str, decision: Decision) -> Decision:
        self._apply(call, decision)
        self.admit()
        return decision

    # ------------------------------------------------------------------ generation
    def start(self, uid: int, version: int | None = None, *, readmit: bool = True) -> None:
        version = self.synced if version is None else version
        self.queued.remove(uid)
        self.running[uid] = {}
        self.start_versions[uid] = version
        decision = self.policy.on_group_started(uid=uid, version=version, now=0.0)
        if readmit:
            self._event("on_group_started", decision)
        else:
            self._apply("on_group_started", decision)

    def generating_version(self, uid: int) -> int:
        return self.synced if self.partial else self.start_versions[uid]

    def tokens(self, uid: int, n: int = 1, version: int | None = None) -> Decision:
        """Report `n` more tokens of a running group (default: on the version it generates with)."""
        version = self.generating_version(uid) if version is None else version
        self.running[uid][version] = self.running[uid].get(version, 0) + n
        return self._event("on_tokens", self.policy.on_tokens(uid=uid, version=version, tokens=n, now=0.0))

    def finish(self, uid: int, versions: dict[int, int] | None = None, last_versions: Iterable[int] = ()) -> Decision:
        """End generation: add one token on the generating version unless `versions` is given."""
        if versions is None:
            versions = self.running[uid]
            v = self.generating_version(uid)
            versions[v] = versions.get(v, 0) + 1
        self.running.pop(uid)
        self.done[uid] = dict(versions)
        last = tuple(last_versions) or (max(versions),) * self.policy.ctx.group_size
        pairs = sorted(versions.items())
        decision = self.policy.on_group_finished(uid=uid, versions=pairs, now=0.0, last_versions=last)
        return self._event("on_group_finished", decision)

    def finish_all(self, uids: Iterable[int] | None = None) -> None:
        for uid in list(self.running if uids is None else uids):
            if uid in self.running:
                self.finish(uid)

    def engine_stats(self, kv_usage: float, queued: int = 0) -> Decision:
        return self._event("on_engine_stats", self.policy.on_engine_stats(kv_usage=kv_usage, queued=queued, now=0.0))

    # ------------------------------------------------------------------ trainer
    def train_step(self) -> list[int] | None:
        """Ask for batch `step`; on a batch: record it, finish the step, publish (and sync)."""
        if self.synced < self.published:
            self.sync()  # a version syncs before the next step ends (sync lag ≤ 1)
        decision = self._event("select_batch", self.policy.select_batch(step=self.step, now=0.0))
        if decision.train is None:  # else train_batch has booked it
            return None
        self._event("on_step_done", self.policy.on_step_done(step=self.step, now=0.0))
        self.step += 1
        self.published = self.step
        self._event("on_version_published", self.policy.on_version_published(version=self.step, now=0.0))
        if self.auto_sync:
            self.sync()
        return decision.train

    def sync(self) -> None:
        """Every worker now holds the published version; partial rollouts report their old tokens."""
        old, self.synced = self.synced, self.published
        if self.partial:
            for uid in list(self.running):
                if uid in self.running and self.start_versions[uid] <= old:
                    self.tokens(uid, 1, version=old)
        self._event("on_version_synced", self.policy.on_version_synced(version=self.synced, now=0.0))

    # ------------------------------------------------------------------ views
    @property
    def max_staleness(self) -> int:
        return max((t.staleness for t in self.trained), default=0)

    def trained_at(self, step: int) -> list[Trained]:
        return [t for t in self.trained if t.step == step]

    def untrained(self) -> int:
        return len(self.queued) + len(self.running) + len(self.done)


def random_run(driver: ScriptedDriver, rng: random.Random, steps: int, max_events: int = 20_000) -> ScriptedDriver:
    """Random completion orders, start times, syncs and token reports until `steps` are trained.

    Raises `Deadlock` when nothing can move: no group queued or running, no pending sync, and the
    trainer cannot form a batch.
    """
    for _ in range(max_events):
        if driver.step >= steps:
            return driver
        actions = ["train"]
        if driver.queued:
            actions.append("start")
        if driver.running:
            actions += ["finish", "finish", "tokens"]
        if driver.synced < driver.published:
            actions.append("sync")
        action = rng.choice(actions)
        if action == "start":
            driver.start(rng.choice(driver.queued))
        elif action == "finish":
            driver.finish(rng.choice(sorted(driver.running)))
        elif action == "tokens":
            driver.tokens(rng.choice(sorted(driver.running)), rng.randint(1, 3))
        elif action == "sync":
            driver.sync()
        elif driver.train_step() is None and actions == ["train"] and not (driver.queued or driver.running):
            # (a selection that evicts can admit a replacement: then the run goes on)
            raise Deadlock(f"{driver.policy.name}: stuck at step {driver.step} with {len(driver.done)} done groups")
    raise AssertionError(f"{driver.policy.name}: {steps} steps not reached in {max_events} events")
