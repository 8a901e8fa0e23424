"""The simulator: drives a staleness policy through the event protocol of `planner.base`.

    sim = Simulator(policy, ctx, workload, SimConfig(), seed=0, ledger=LedgerWriter(path))
    result = sim.run()   # SimResult (planner/sim/result.py): summary (§8 keys), step rows, deadlock flag

The loop is vidur's: pop the earliest `(time, kind, seq)` event, set the clock, run its handler,
push the events the handler returns. Handlers never touch the heap; what they schedule is
collected in `self._out` and pushed by the loop. After every event that changed anything a policy
can see, `_settle` asks the policy to admit from the candidate window and, while the trainer
waits, to select batch `k`; decisions are applied at once through `planner.driver.apply_decision`
(moves to the ledger, drops, the batch, admissions in order), the simulator being its host.

Stalls, the publish → load lag and colocation are modelled as docs/design.md §4 states them:
a hung attempt (`sim.faults.stall_prob`) is aborted by a STALL event `stall_timeout_s` after it
started and reported through `on_group_lost(prefix_kept=False)`, as the runtime's watchdog
(jaxrl_async/runtime/liveness.py) does; a worker loads a published version `sim.workers.load_lag`
later (a LOAD event), generating on the old weights meanwhile; `sim.trainer.wait_sync` holds the
next step until every live worker holds the last version; `sim.workers.colocated_slowdown` slows
every worker's decode steps from a batch's hand-over to its STEP_DONE (Worker.set_slow), each live
worker's next completion recomputed at both instants. At 0 no factor changes and no event is
added: runs are exactly those without the term.

Multi-turn groups (`workload=multi_turn`) run as turn runs with environment steps between them
(an ENV event ends one); `Episode` (planner/sim/episodes.py) keeps their samples, the loop
routes their turns, reports the group's start and end to the policy and writes its `turns` spans.

The tail (`Decision.critical`, `Decision.migrate`; docs/design.md §2.14) is `SimTail`'s
(planner/sim/tail.py): it decides what a mark or a move does to the workers; the loop books a
moved prefix with the policy, writes the ledger's `migrate` line and reschedules the workers.

Everything random comes from `seed` (numpy Generators spawned per purpose), and nothing reads a
clock, so a run is a function of (policy, config, seed). A run that runs out of events while the
trainer still waits is a policy bug: it stops and reports `deadlock: true`.
"""

from __future__ import annotations

import time as wallclock
from typing import Any

import numpy as np

from planner.driver import apply_decision
from planner.ledger import LedgerWriter, NullLedger
from planner.sim.config import SimConfig
from planner.sim.episodes import Episode, EpisodeStats
from planner.sim.events import EventKind, EventQueue
from planner.sim.faults import FaultPlan
from planner.sim.group import SimGroup
from planner.sim.metrics import RunMetrics
from planner.sim.recorder import EventRecorder
from planner.sim.result import SimResult, step_row, summarize
from planner.sim.stream import AdmissionWindow
from planner.sim.tail import SimTail
from planner.sim.tail_log import TailLog
from planner.sim.trainer import SimTrainer
from planner.sim.workers import Worker
from planner.sim.workloads import Workload
from planner.types import Admission, Decision, Drop, GroupState, Move, PlanContext

MAX_SETTLE_ROUNDS = 10_000  # decisions that keep changing state without time advancing: a livelock


class Simulator:
    def __init__(
        self,
        policy: Any,
        ctx: PlanContext,
        workload: Workload,
        cfg: SimConfig,
        *,
        seed: int,
        ledger: LedgerWriter | None = None,
        recorder: EventRecorder | None = None,
    ) -> None:
        if cfg.workers.max_concurrency < ctx.group_size:
            raise ValueError(
                f"sim.workers.max_concurrency={cfg.workers.max_concurrency}: must be >= group_size={ctx.group_size} "
                "(a group starts as a whole)"
            )
        self.policy = policy
        self.p = recorder.wrap(policy) if recorder is not None else policy
        self.ctx = ctx
        self.cfg = cfg
        self.workload = workload
        self.seed = seed
        self.ledger = ledger if ledger is not None else NullLedger()
        # Spawned children depend on their index only: adding the stall stream keeps older runs identical.
        data_rng, fault_rng, self.stall_rng = (np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(3))
        self.stall_prob = cfg.faults.stall_prob
        self.stall_timeout_s = cfg.faults.stall_timeout_s
        self.window = AdmissionWindow(workload, data_rng, cfg.admission_window or 2 * ctx.batch_groups)
        self.workers = [Worker(i, cfg.workers) for i in range(cfg.workers.num_workers)]
        self.partial_sync = cfg.workers.sync_mode == "partial"
        self.load_lag = cfg.workers.load_lag
        self.colocated_slowdown = cfg.workers.colocated_slowdown
        self.wait_sync = cfg.trainer.wait_sync
        self.trainer = SimTrainer(cfg.trainer, ctx.total_steps)
        self.faults = FaultPlan(cfg.faults, cfg.workers.num_workers, fault_rng)
        self.metrics = RunMetrics()
        self.tail_log = TailLog()  # each group's seconds, for the tail analysis
        self.tail = SimTail(cfg.workers, self.workers, self.tail_log)  # critical marks, migrations
        self.episodes = EpisodeStats()  # what trained multi-turn groups' episodes did
        self.queue = EventQueue()
        self.now = 0.0
        self.groups: dict[int, SimGroup] = {}  # admitted, untrained, not dropped
        self.lost: dict[int, SimGroup] = {}  # lost to a fault, not re-admitted yet
        self.parked: list[SimGroup] = []  # admitted while no worker was alive
        self.published = 0
        self.synced = 0  # last version reported by on_version_synced
        self.admitted = 0
        self.readmissions = 0
        self.stalls = 0  # hung attempts aborted at their stall timeout
        self._enqueue_seq = 0
        self._out: list[tuple[float, EventKind, Any]] = []
        self._changed = False  # something a policy can see changed since the last settle
        self._ask = True  # the trainer should (re)ask select_batch
        self._step_info: dict[str, Any] = {}
        self._handlers = {
            EventKind.FAULT: self._on_fault,
            EventKind.RESTART: self._on_restart,
            EventKind.SYNC_DONE: self._on_sync_done,
            EventKind.COMPLETION: self._on_completion,
            EventKind.STEP_DONE: self._on_step_done,
            EventKind.STALL: self._on_stall,
            EventKind.LOAD: self._on_load,
            EventKind.ENV: self._on_env,
        }

    # ================================================================== loop
    def run(self) -> SimResult:
        wall0 = wallclock.perf_counter()
        for t, w in self.faults.initial():
            self.queue.push(t, EventKind.FAULT, w)
        queue, handlers, out = self.queue, self._handlers, self._out
        self._settle()
        while not self.trainer.finished:
            for ev in out:
                queue.push(*ev)
            out.clear()
            if not len(queue):
                break
            self.now, kind, payload = queue.pop()
            handlers[kind](payload)
            if self._changed:
                self._settle()
        deadlock = not self.trainer.finished
        self._apply(self.p.finish(now=self.now), "finish")
        self.ledger.flush()
        return summarize(self, deadlock, wallclock.perf_counter() - wall0)

    def _settle(self) -> None:
        """Let the policy admit, and select while the trainer waits, until nothing changes."""
        p, trainer = self.p, self.trainer
        for _ in range(MAX_SETTLE_ROUNDS):
            self._changed = False
            self._apply(p.admit(now=self.now, candidates=self.window.candidates), "admit")
            if trainer.waiting and self._ask and (not self.wait_sync or self.synced >= trainer.step):
                self._ask = False
                self._apply(p.select_batch(step=trainer.step, now=self.now), "select_batch")
            if not self._changed:
                return
        raise RuntimeError(f"policy {self.policy.name}: decisions keep changing state at t={self.now} (livelock)")

    # ================================================================== decisions
    def _apply(self, d: Decision, call: str) -> None:
        if d.admit or d.drop or d.moves or d.train is not None or d.critical or d.migrate:  # most are empty: the hot path
            apply_decision(self, d, call=call, policy=self.policy.name)

    # The DecisionHost hooks (planner.driver); apply_decision has checked each uid.
    def held(self, uid: int) -> GroupState | None:
        g = self.groups.get(uid)  # admitted and untrained: trained and dropped groups are gone
        if g is None:
            return GroupState.CANDIDATE if uid in self.window else None
        return g.state

    def record_moves(self, moves: list[Move]) -> None:
        self.ledger.moves(moves)

    def mark_critical(self, uids: list[int]) -> None:
        for uid in uids:
            g = self.groups[uid]
            if g.episode is not None:  # its turns in flight and to come; environment steps stay as they are
                for w in self.tail.mark_turns(self.now, g, g.episode.runs()):
                    self._reschedule(w)
                continue
            w = self.tail.mark(self.now, g)
            if w is not None:
                self._reschedule(w)

    def migrate_groups(self, uids: list[int]) -> None:
        for uid in uids:
            g = self.groups[uid]
            for run in (g.episode.runs() if g.episode is not None else [g]):  # a multi-turn group: its turns
                if g.state == GroupState.DROPPED:
                    break  # dropped by the policy while a move was reported
                self._migrate(g, run)

    def _migrate(self, g: SimGroup, run: SimGroup) -> None:
        """Move `run` (group `g` itself, or one of its turn runs) to a better worker if one exists."""
        move = self.tail.leave(self.now, run)
        if move is None:
            return
        src, dst, booked = move
        if booked:
            self._apply(self.p.on_tokens(uid=g.uid, version=run.version, tokens=booked, now=self.now), "on_tokens")
        versions = g.episode.versions_list() if g.episode is not None else g.versions_list()
        self.ledger.migrate(g.uid, src.index, dst.index, versions)
        self.tail.arrive(self.now, run, src, dst)
        self._kick(src, force=True)
        self._kick(dst, force=True)
        self._changed = True

    def _reschedule(self, w: Worker) -> None:
        """`w` changed (a start, an end, its rates): its next completion is recomputed; the
        COMPLETION events already queued for it go stale (their epoch is older)."""
        w.epoch += 1
        t = w.next_completion()
        if t is not None:
            self._out.append((t, EventKind.COMPLETION, (w.index, w.epoch)))

    def admit_group(self, a: Admission) -> None:
        if a.uid in self.window:
            c, prompt_tokens, lengths, draws = self.window.take(a.uid)
            g = SimGroup(a.uid, c.prompt_id, prompt_tokens, lengths)
            if draws is not None:
                g.episode = Episode(g, draws)
            self.groups[a.uid] = g
            self.admitted += 1
            self.metrics.admit(g.total_length)
        else:  # a lost group
            g = self.lost.pop(a.uid)
            self.readmissions += 1
        self.ledger.admit(a)
        self.tail_log.admitted(a.uid, self.now)
        g.priority = a.priority
        g.min_version = a.version
        g.critical = False  # a new attempt: the policy marks it again if the trainer needs it
        g.hangs = bool(self.stall_prob) and self.stall_rng.random() < self.stall_prob  # drawn per attempt
        self._changed = True
        if g.episode is None:
            self._route(g)
            return
        g.state = GroupState.QUEUED
        for run in g.episode.to_queue(self.now):
            self._route(run)
        if g.episode.done:  # lost after its last turn: nothing left to run
            self._episode_started(g, a.version)
            if g.state == GroupState.RUNNING:  # not dropped at its start
                self._episode_finished(g)

    def drop_group(self, d: Drop) -> None:
        g = self.groups[d.uid]
        if g.episode is not None:
            self._stop_turns(g, report=False)
            g.episode.attempt += 1  # its environment steps in flight end nothing
            if g.state == GroupState.LOST:
                del self.lost[d.uid]
        elif g.state == GroupState.RUNNING:
            w = self.workers[g.worker]
            w.abort(self.now, g)
            self._kick(w, force=True)
        elif g.state == GroupState.LOST:
            del self.lost[d.uid]
        tokens = g.episode.generated() if g.episode is not None else g.generated
        g.state = GroupState.DROPPED
        del self.groups[d.uid]
        self.ledger.drop(d, tokens, length=g.total_length)
        self.metrics.drop(d.reason, tokens)
        self._changed = self._ask = True

    def train_batch(self, uids: list[int]) -> None:
        trainer = self.trainer
        if not trainer.waiting:
            raise ValueError(f"policy {self.policy.name}: a batch while the trainer is busy")
        step = trainer.step
        batch, prompt_tokens, entries = [], 0, []
        for uid in uids:
            g = self.groups[uid]
            batch.append((uid, g.versions_list(), len(g.lengths)))
            prompt_tokens += g.prompt_tokens * len(g.lengths)
            if g.episode is None:
                entries.append((uid, batch[-1][1]))
            else:  # the environment's replies are in the trained sequences too, masked out of the loss
                entries.append((uid, batch[-1][1], g.episode.turns()))
                prompt_tokens += g.episode.reply_tokens()
                self.episodes.trained(g.episode)
            g.state = GroupState.TRAINED
            del self.groups[uid]
        self.ledger.train(step, entries)
        self.tail_log.trained(step, uids)
        hist = self.metrics.train(step, batch)
        tokens = sum(hist.values())
        wait = self.now - trainer.wait_since
        end = trainer.begin(self.now, tokens + prompt_tokens)
        if self.colocated_slowdown:
            self._set_slow(1.0 + self.colocated_slowdown)
        self._step_info = {"start_s": self.now, "wait_s": wait, "tokens": tokens, "batch": hist}
        self._out.append((end, EventKind.STEP_DONE, step))
        self._changed = True

    # ================================================================== workers
    def _route(self, g: SimGroup) -> None:
        """Send a group to the least-loaded live worker (or park it while none is alive).

        Workers that already hold the group's start barrier (`min_version`) go first; a group sent
        to an older worker waits there until it has loaded newer weights.
        """
        g.seq = self._enqueue_seq
        self._enqueue_seq += 1
        live = [w for w in self.workers if w.alive]
        if not live:
            g.state, g.worker = GroupState.QUEUED, -1
            self.parked.append(g)
            return
        w = min([w for w in live if w.version >= g.min_version] or live, key=Worker.load)
        w.enqueue(g)
        self._kick(w)

    def _set_slow(self, factor: float) -> None:
        """Every worker's decode steps cost `factor`× from now on (the trainer started or ended a
        step); live workers' next completions are recomputed (older COMPLETION events go stale)."""
        for w in self.workers:
            w.set_slow(self.now, factor)
            if w.alive:
                self._reschedule(w)

    def _kick(self, w: Worker, force: bool = False) -> None:
        """After `w` changed: load pending weights when drained, start queued groups, reschedule."""
        changed = force
        if w.pending_version is not None and w.can_load():
            self._load(w, w.pending_version)
            changed = True
        started = w.start_queued(self.now)
        if started:
            changed = True
            for g in started:
                self._started(w, g)
        if changed:
            self._reschedule(w)

    def _started(self, w: Worker, g: SimGroup) -> None:
        if g.turn_of is not None:
            self._turn_started(w, g)
            return
        if g.stuck:  # a hung attempt: the watchdog gives up on it stall_timeout_s from now
            self._out.append((self.now + self.stall_timeout_s, EventKind.STALL, (g.uid, w.index, g.token)))
        self.ledger.start(g.uid, g.version)
        self.tail_log.started(g.uid, w.index, self.now, w.stalled_by(self.now), max(g.rem, default=0))
        self._changed = True
        self._apply(self.p.on_group_started(uid=g.uid, version=g.version, now=self.now), "on_group_started")
        if g.state == GroupState.DONE:  # nothing to generate
            self._finished(g, g.version)

    def _finished(self, g: SimGroup, version: int) -> None:
        if g.turn_of is not None:
            self._turn_finished(g)
            return
        last = tuple(g.last_versions) if g.last_versions else (version,)
        self.tail_log.finished(g.uid, g.worker, self.now, self.workers[g.worker].stalled_by(self.now))
        self._changed = self._ask = True
        self._apply(
            self.p.on_group_finished(uid=g.uid, versions=g.versions_list(), now=self.now, last_versions=last),
            "on_group_finished",
        )

    # ================================================================== multi-turn episodes
    def _turn_started(self, w: Worker, run: SimGroup) -> None:
        """A turn run started on `w`; the group's first turn of an attempt starts the group."""
        g, sample = run.turn_of
        g.episode.started(sample, self.now)
        if g.state == GroupState.QUEUED:
            self._episode_started(g, run.version)
        if run.state == GroupState.DONE and g.state == GroupState.RUNNING:  # a resumed turn with nothing left
            self._turn_finished(run)

    def _episode_started(self, g: SimGroup, version: int) -> None:
        g.state = GroupState.RUNNING
        self.ledger.start(g.uid, version)
        self._changed = True
        self._apply(self.p.on_group_started(uid=g.uid, version=version, now=self.now), "on_group_started")

    def _turn_finished(self, run: SimGroup) -> None:
        """A turn ended: its sample goes to its environment step (an ENV event ends it)."""
        g, sample = run.turn_of
        env_s = g.episode.turn_done(sample, self.now)
        self._out.append((self.now + env_s, EventKind.ENV, (g.uid, sample, g.episode.attempt)))

    def _on_env(self, payload: tuple[int, int, int]) -> None:
        """A sample's environment step ended: its next turn is queued, or the sample is done."""
        uid, sample, attempt = payload
        g = self.groups.get(uid)
        if g is None or g.episode is None or g.episode.attempt != attempt:
            return  # dropped, trained, or started over meanwhile
        if g.episode.env_done(sample):
            if g.state != GroupState.LOST:  # a lost group queues it when re-admitted
                for run in g.episode.to_queue(self.now):
                    self._route(run)
        elif g.episode.done and g.state != GroupState.LOST:
            if g.state == GroupState.QUEUED:  # re-admitted after its last turn: nothing left to run
                self._episode_started(g, g.min_version)
            if g.state == GroupState.RUNNING:  # not dropped at its start
                self._episode_finished(g)

    def _episode_finished(self, g: SimGroup) -> None:
        g.state = GroupState.DONE
        self._changed = self._ask = True
        self._apply(self.p.on_group_finished(uid=g.uid, versions=g.versions_list(), now=self.now,
                                             last_versions=g.episode.last_versions()), "on_group_finished")

    def _stop_turns(self, g: SimGroup, *, report: bool) -> None:
        """Take every turn of `g` off the engine (a fault elsewhere, a drop); with `report`, the
        policy hears of the tokens each running one booked."""
        for run in g.episode.runs():
            if run.state == GroupState.RUNNING:
                w = self.workers[run.worker]
                booked = w.abort(self.now, run)
                g.episode.stopped(run)  # before the policy hears of it: a drop then finds it stopped
                self._kick(w, force=True)
                if report and booked:
                    self._apply(self.p.on_tokens(uid=g.uid, version=run.version, tokens=booked, now=self.now),
                                "on_tokens")
            else:
                g.episode.stopped(run)

    def _owners(self, lost: list[SimGroup], keep: bool) -> list[SimGroup]:
        """The groups a dead worker's runs belong to: a turn run stands for its multi-turn group,
        once, whose other turns stop with it."""
        out, seen = [], set()
        for g in lost:
            if g.turn_of is None:
                out.append(g)
                continue
            g.turn_of[0].episode.stopped(g)
        for g in lost:
            if g.turn_of is not None and g.turn_of[0].uid not in seen:
                owner = g.turn_of[0]
                seen.add(owner.uid)
                if owner.state not in (GroupState.DROPPED, GroupState.LOST):
                    self._stop_turns(owner, report=keep)
                    out.append(owner)
        return out

    def _load(self, w: Worker, version: int) -> None:
        """Weights `version` go onto `w` (partial rollout books in-flight tokens to the old version)."""
        for g, old, tokens in w.apply_version(self.now, version):
            self._apply(self.p.on_tokens(uid=g.uid, version=old, tokens=tokens, now=self.now), "on_tokens")
        start, end = w.load_span
        self.tail_log.loaded(w.index, start, end)
        self._out.append((end, EventKind.SYNC_DONE, (w.index, version, w.life)))

    def _begin_load(self, w: Worker, version: int) -> None:
        """`w` takes published weights `version`: now (partial), or once `Worker.can_load` (drain:
        drained; pinned: a resident slot is free — at once unless K versions are pinned)."""
        if self.partial_sync:
            self._load(w, version)
            self._kick(w, force=True)
        else:
            w.hold(self.now, version)
            self._kick(w)

    def _on_load(self, payload: tuple[int, int, int]) -> None:
        index, version, life = payload
        w = self.workers[index]
        if life != w.life or not w.alive or version <= max(w.version, w.pending_version or 0):
            return  # died meanwhile, or already on newer weights (revived, or a shorter lag)
        self._begin_load(w, version)

    def _check_synced(self) -> None:
        live = [w.synced_version for w in self.workers if w.alive]
        if live and min(live) > self.synced:
            self.synced = min(live)
            self._changed = True
            self._apply(self.p.on_version_synced(version=self.synced, now=self.now), "on_version_synced")

    # ================================================================== handlers
    def _on_completion(self, payload: tuple[int, int]) -> None:
        index, epoch = payload
        w = self.workers[index]
        if epoch != w.epoch or not w.alive:
            return  # superseded by a reschedule
        for g in w.complete(self.now):
            self._finished(g, g.version)
        self._kick(w, force=True)

    def _on_sync_done(self, payload: tuple[int, int, int]) -> None:
        index, version, life = payload
        w = self.workers[index]
        if life != w.life or not w.alive:
            return
        w.synced_version = max(w.synced_version, version)
        self._check_synced()

    def _on_step_done(self, step: int) -> None:
        trainer = self.trainer
        version = trainer.end(self.now)
        if self.colocated_slowdown:
            self._set_slow(1.0)
        self._changed = self._ask = True
        self._apply(self.p.on_step_done(step=step, now=self.now), "on_step_done")
        step_row(self, step, self._step_info)
        if trainer.finished:
            return
        live = [w for w in self.workers if w.alive]
        self.published = version
        self._apply(self.p.on_version_published(version=version, now=self.now), "on_version_published")
        for w in live:
            if self.load_lag:
                self._out.append((self.now + self.load_lag, EventKind.LOAD, (w.index, version, w.life)))
            else:
                self._begin_load(w, version)
        queued = sum(1 for g in self.groups.values() if g.state == GroupState.QUEUED)
        kv = sum(w.kv_used for w in live) / max(1, sum(w.kv_cap for w in live))
        self._apply(self.p.on_engine_stats(kv_usage=kv, queued=queued, now=self.now), "on_engine_stats")

    def _on_fault(self, index: int) -> None:
        w = self.workers[index]
        if not w.alive:
            return
        running, queued = w.kill(self.now)
        keep = self.faults.prefix_kept
        lost = []
        for g, version, tokens in running:
            if keep and tokens:
                self._apply(self.p.on_tokens(uid=g.uid, version=version, tokens=tokens, now=self.now), "on_tokens")
            lost.append(g)
        lost.extend(queued)
        lost = self._owners(lost, keep)
        for g in lost:
            if g.state != GroupState.DROPPED:  # not dropped by the policy while we reported the fault
                self._lose(g, keep=keep)
        self._changed = self._ask = True
        self._check_synced()
        for g in lost:
            if g.state == GroupState.LOST:
                self._apply(self.p.on_group_lost(uid=g.uid, prefix_kept=keep, now=self.now), "on_group_lost")
        if self.cfg.faults.restart_after is not None:
            self._out.append((self.now + self.cfg.faults.restart_after, EventKind.RESTART, index))

    def _on_stall(self, payload: tuple[int, int, int]) -> None:
        """A hung attempt's stall timeout expired: abort it and regenerate the group through the
        fault path, as the runtime's watchdog does (prefix_kept=False: its earlier tokens are wasted)."""
        uid, index, token = payload
        g = self.groups.get(uid)
        if g is None or g.state != GroupState.RUNNING or (g.worker, g.token) != (index, token) or not g.stuck:
            return  # dropped, or its worker died and it was re-admitted meanwhile
        w = self.workers[g.worker]
        w.abort(self.now, g)
        self._kick(w, force=True)
        self.stalls += 1
        self._lose(g, keep=False)
        self._changed = self._ask = True
        self._apply(self.p.on_group_lost(uid=uid, prefix_kept=False, now=self.now), "on_group_lost")

    def _lose(self, g: SimGroup, *, keep: bool) -> None:
        """`g`'s attempt is given up (a fault, a stall); without its prefix (`keep` False) its
        tokens are wasted and a re-admission regenerates it from the start."""
        if not keep:
            self.metrics.waste(g.episode.generated() if g.episode is not None else g.generated)
            g.versions, g.last_versions, g.done_tok, g.token = {}, [], [0] * len(g.lengths), -1
            if g.episode is not None:
                g.episode.restart()
        g.state = GroupState.LOST
        self.lost[g.uid] = g

    def _on_restart(self, index: int) -> None:
        w = self.workers[index]
        w.revive(self.now, self.published)
        self.tail_log.loaded(w.index, w.stall_until - w.t_sync, w.stall_until)  # a restart loads the newest weights
        self._changed = True
        parked, self.parked = self.parked, []
        for g in parked:
            if g.state == GroupState.QUEUED:
                self._route(g)
        self._check_synced()
        self._kick(w, force=True)
        nxt = self.faults.next_random(index, self.now)
        if nxt is not None:
            self._out.append((nxt[0], EventKind.FAULT, index))
