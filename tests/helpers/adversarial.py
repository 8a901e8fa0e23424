"""An adversarial driver: every interleaving a real system could produce, chosen by an RNG.

Unlike the simulator, which follows a cost model, this driver picks the next event at random
among those that are possible — any queued group may start, any running group may finish (with
its tokens spread over every version it could have seen under partial rollout), a worker may
lose any running group, weight syncs lag arbitrarily, the trainer takes arbitrary time. It
writes a real ledger, so the audit judges the result.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path

from planner.base import PolicyBase
from planner.driver import apply_decision
from planner.ledger import LedgerWriter
from planner.types import Admission, Candidate, Decision, Drop, GroupState, Move


@dataclass
class Outcome:
    steps: int
    deadlock: bool
    waits: list[tuple[int, int]] = field(default_factory=list)  # (step, done groups) at each wait
    forced_violations: list[str] = field(default_factory=list)


class AdversarialDriver:
    def __init__(self, policy: PolicyBase, run_dir: Path, seed: int, *, faults: bool = True, partial: bool = True,
                 window: int | None = None, check_forced=None) -> None:
        self.p = policy
        self.rng = random.Random(seed)
        self.ledger = LedgerWriter(run_dir / "ledger.jsonl")
        self.faults = faults
        self.partial = partial
        self.window = window or 2 * policy.ctx.batch_groups
        self.check_forced = check_forced  # callable(policy) -> str | None, run at each wait
        self.next_uid = 0
        self.pending: list[Candidate] = []
        self.queued: dict[int, float] = {}  # uid -> priority
        self.barrier: dict[int, int] = {}  # uid -> Admission.version: never start on older weights
        self.running: dict[int, int] = {}  # uid -> version at start (after resume: at resume)
        self.prefix: dict[int, dict[int, int]] = {}  # uid -> tokens kept across a resume
        self.done_versions: dict[int, list[tuple[int, int]]] = {}
        self.lost: set[int] = set()  # lost by a worker, waiting for a re-admission or a drop
        self.synced = 0
        self.published = 0
        self.step = 0
        self.training: list[int] | None = None
        self.now = 0.0

    # ----------------------------------------------------------------- applying decisions
    def apply(self, d: Decision, call: str) -> None:
        apply_decision(self, d, call=call, policy=self.p.name)

    # The DecisionHost hooks (planner.driver).
    def held(self, uid: int) -> GroupState | None:
        if uid in self.done_versions:
            return GroupState.DONE
        if uid in self.running:
            return GroupState.RUNNING
        if uid in self.queued:
            return GroupState.QUEUED
        if uid in self.lost:
            return GroupState.LOST
        return GroupState.CANDIDATE if any(c.uid == uid for c in self.pending) else None

    def record_moves(self, moves: list[Move]) -> None:
        self.ledger.moves(moves)

    def mark_critical(self, uids: list[int]) -> None:
        pass  # one engine that never speculates

    def migrate_groups(self, uids: list[int]) -> None:
        pass  # one engine: nowhere to move to

    def drop_group(self, d: Drop) -> None:
        self.ledger.drop(d)
        self.queued.pop(d.uid, None)
        self.running.pop(d.uid, None)
        self.done_versions.pop(d.uid, None)
        self.lost.discard(d.uid)

    def train_batch(self, uids: list[int]) -> None:
        self.ledger.train(self.step, [(uid, self.done_versions.pop(uid)) for uid in uids])
        self.training = uids

    def admit_group(self, a: Admission) -> None:
        self.ledger.admit(a)
        self.pending = [c for c in self.pending if c.uid != a.uid]
        self.lost.discard(a.uid)
        self.queued[a.uid] = a.priority
        self.barrier[a.uid] = a.version

    def candidates(self) -> list[Candidate]:
        while len(self.pending) < self.window:  # the data stream's next prompts
            uid = self.next_uid
            self.next_uid += 1
            self.pending.append(Candidate(uid, f"p{uid % 7}", oracle_tokens=self.rng.randint(1, 50)))
        return self.pending

    def admit(self) -> None:
        self.apply(self.p.admit(now=self.now, candidates=self.candidates()), "admit")

    # ----------------------------------------------------------------- events
    def start_one(self) -> None:
        # Adversarial: usually the engine's priority order, sometimes any queued group.
        if self.rng.random() < 0.7:
            uid = min(self.queued, key=lambda u: (self.queued[u], u))
        else:
            uid = self.rng.choice(sorted(self.queued))
        del self.queued[uid]
        # Any worker may take it: one still on the synced version or one that loaded newer weights.
        version = self.rng.randint(max(self.synced, self.barrier[uid]), self.published)
        self.running[uid] = version
        self.ledger.start(uid, version)
        self.apply(self.p.on_group_started(uid=uid, version=version, now=self.now), "on_group_started")

    def finish_one(self) -> None:
        uid = self.rng.choice(sorted(self.running))
        v0 = self.running.pop(uid)
        counts = dict(self.prefix.pop(uid, {}))
        top = self.published if self.partial else v0
        for _ in range(self.rng.randint(1, 4)):
            v = self.rng.randint(v0, top)
            counts[v] = counts.get(v, 0) + self.rng.randint(1, 30)
        versions = sorted(counts.items())
        self.done_versions[uid] = versions
        self.apply(self.p.on_group_finished(uid=uid, versions=versions, now=self.now), "on_group_finished")

    def lose_one(self) -> None:
        uid = self.rng.choice(sorted(self.running))
        v0 = self.running.pop(uid)
        keep = self.rng.random() < 0.5
        if keep:  # resume elsewhere: tokens so far keep their versions
            self.prefix[uid] = {v0: self.rng.randint(1, 10)}
        else:
            self.prefix.pop(uid, None)
        self.lost.add(uid)
        self.apply(self.p.on_group_lost(uid=uid, prefix_kept=keep, now=self.now), "on_group_lost")

    def sync(self) -> None:
        self.synced = self.published
        self.apply(self.p.on_version_synced(version=self.synced, now=self.now), "on_version_synced")

    def try_train(self, out: Outcome) -> None:
        d = self.p.select_batch(step=self.step, now=self.now)
        self.apply(d, "select_batch")  # a batch: train_batch books it and the trainer runs it
        if d.train is None:
            out.waits.append((self.step, self.p.num_done))
            if self.check_forced is not None:
                msg = self.check_forced(self.p)
                if msg:
                    out.forced_violations.append(msg)

    def step_done(self) -> None:
        self.apply(self.p.on_step_done(step=self.step, now=self.now), "on_step_done")
        self.step += 1
        self.training = None
        self.published = self.step
        self.apply(self.p.on_version_published(version=self.published, now=self.now), "on_version_published")

    # ----------------------------------------------------------------- loop
    def run(self, max_events: int = 200_000) -> Outcome:
        out = Outcome(steps=0, deadlock=False)
        total = self.p.ctx.total_steps
        last_wait_state = None
        for _ in range(max_events):
            self.now += 1.0
            if self.step >= total:
                break
            self.admit()
            if self.training is None:
                state = (self.step, self.p.num_done, len(self.running), len(self.queued), self.synced)
                if state != last_wait_state:  # re-ask only when something changed
                    self.try_train(out)
                    last_wait_state = state if self.training is None else None
            actions = []
            if self.queued:
                actions += [self.start_one] * 3
            if self.running:
                actions += [self.finish_one] * 3
                if self.faults:
                    actions.append(self.lose_one)
            if self.synced < self.published:
                actions.append(self.sync)
            if self.training is not None:
                actions += [self.step_done] * 2
            if not actions:
                out.deadlock = True
                break
            self.rng.choice(actions)()
        self.apply(self.p.finish(now=self.now), "finish")
        self.ledger.close()
        out.steps = self.step
        return out
