"""The local-mode controller: one process, asyncio for control, threads for device work.

It drives a staleness policy (`planner.base.Policy`) through the simulator's event protocol with
real components behind every event (docs/design.md §5.2 draws the flow): admissions are
submitted, the engine's pieces become `on_group_started` / `on_tokens` / (once scored)
`on_group_finished`, the idle trainer selects, trains (`on_step_done`) and publishes
(`on_version_published`, `on_version_synced`, §5.3); after every event `_settle` admits and
selects until nothing changes. Every policy call and its decision run under one asyncio lock, so
the policy sees a sequence of events; device work (engine thread, train-step thread) overlaps.

Version k+1 is published after step k even when the trainer skipped the update (a non-finite
loss): the weights equal v_k then, so labelling them k+1 only makes the ledger's staleness
conservative. Faults (§5.4): a lost or stalled group goes through the planner's fault path,
`on_group_lost(prefix_kept=False)`, and is regenerated from scratch under its start barrier.
Stopping (§5.5): `request_stop()` lets a running step finish, checkpoints, ends without `finish`.

This module keeps the order of calls; each side job has a room of its own (runtime/__init__.py):
the groups' table, the engine outbox, a step's trainer side (training.py) and the run's record
(recording.py), rewards (scoring.py), the tail's hooks, evaluation, the clock.
"""

from __future__ import annotations

import asyncio
import copy
from pathlib import Path
from typing import Any

from jaxrl_async.checkpoint import Checkpointer
from jaxrl_async.engines.base import GenerationEngine
from jaxrl_async.runtime.clock import RunClock
from jaxrl_async.runtime.config import RunConfig
from jaxrl_async.runtime.evaluation import EngineEval, EvalScheduler, is_eval_request
from jaxrl_async.runtime.groups import GroupTable, LiveGroup
from jaxrl_async.runtime.liveness import StallWatch, watch_stalls
from jaxrl_async.runtime.metrics import EngineLoad, MetricsSink, RunResult, RunStats
from jaxrl_async.runtime.outbox import EngineOutbox
from jaxrl_async.runtime.recording import RunRecorder
from jaxrl_async.runtime.requests import group_request
from jaxrl_async.runtime.rollouts import GroupRollout, RolloutCollector
from jaxrl_async.runtime.samples import SampleLog
from jaxrl_async.runtime.scoring import RewardBook, RewardErrorLog, score_group, score_groups
from jaxrl_async.runtime.state import ControllerSnapshot, file_lengths, from_json, to_json
from jaxrl_async.runtime.supervisor import TaskSupervisor
from jaxrl_async.runtime.tail import TailHooks
from jaxrl_async.runtime.tracing import RunTracer
from jaxrl_async.runtime.training import StepRunner
from jaxrl_async.tasks.base import Prompt, Task
from jaxrl_async.tokenizer import Tokenizer
from jaxrl_async.trainer.trainer import Trainer
from planner.driver import apply_decision
from planner.ledger import LedgerWriter
from planner.run_trace import TraceWriter
from planner.types import Admission, Decision, Drop, GroupState, Move


class Controller:
    def __init__(self, cfg: RunConfig, *, policy: Any, engine: GenerationEngine, trainer: Trainer, task: Task,
                 tokenizer: Tokenizer, stream: Any, ledger: LedgerWriter, run_dir: str | Path,
                 sinks: list[MetricsSink] = (), checkpointer: Checkpointer | None = None,
                 stop_token_ids: tuple[int, ...] = (), engine_dtype: str = "float32",
                 run_config_meta: dict[str, Any] | None = None, eval_prompts: list[Prompt] | None = None,
                 trace: TraceWriter | None = None, trace_meta: dict[str, Any] | None = None,
                 samples: SampleLog | None = None) -> None:
        self.cfg = cfg
        self.policy = policy
        self.engine = engine
        self.trainer = trainer
        self.task = task
        self.tokenizer = tokenizer
        self.stream = stream
        self.ledger = ledger
        self.run_dir = Path(run_dir)
        self.sinks = list(sinks)
        self.checkpointer = checkpointer
        self.stop_token_ids = tuple(stop_token_ids)
        self.run_config_meta = dict(run_config_meta or {})  # what a resume must match (checked by the caller)
        self.stats = RunStats()
        self.step = 0  # the next step to train (= steps done)
        self._watch = StallWatch(cfg.rollout)
        # Engine calls of the decision being applied, and requests held at their start barrier.
        self._outbox = EngineOutbox(engine, on_submitted=lambda rid: self._watch.submitted(rid, self.now()))
        self.table = GroupTable(cfg.window)  # the candidates and the admitted, untrained groups
        self._collector = RolloutCollector()
        self._tail = TailHooks(self.table, self._outbox, ledger, lambda: self.stats)  # critical marks, migrations
        self.lock = asyncio.Lock()  # every policy call and its decision run under it
        self._training = False  # a step is training or publishing
        self._ask = True  # something changed since the last select_batch
        self._stop = False
        self._tasks: TaskSupervisor | None = None  # the run's tasks (runtime/supervisor.py), from `run` on
        self._clock = RunClock()
        self._steps = StepRunner(trainer, engine_dtype, self._clock, lambda: self._clock.engine_busy_s(self.engine),
                                 self.now)  # the trainer's side of a step: train, publish
        self._evals = EvalScheduler(list(eval_prompts or []), cfg.eval.every, max_new_tokens=cfg.max_new_tokens,
                                    stop_token_ids=self.stop_token_ids, episodes=task.multi_turn)
        self._rewards = RewardBook(task.cfg.max_reward_failure_rate, cfg.batch_groups * cfg.group_size,
                                   f"resume={self.run_dir}", on_failure=self.request_stop)
        self.trace = trace
        self._tracer = RunTracer(trace, self.now)
        self._recorder = RunRecorder(ledger, self._tracer, self.sinks, cfg.steps, dict(trace_meta or {}))
        self._samples = samples  # samples.jsonl (runtime/samples.py), None: not kept

    # ================================================================== time
    @property
    def version(self) -> int:
        """The newest version the engine holds (= synced); the outbox's start barriers read it."""
        return self._outbox.synced

    @version.setter
    def version(self, version: int) -> None:
        self._outbox.synced = version

    @property
    def last_eval(self) -> dict[str, Any] | None:
        """The last held-out figures (summary.json's `eval`), None before the first."""
        return self._evals.last

    def now(self) -> float:
        """Seconds since the run began, earlier segments of a resumed run included."""
        return self._clock.now()

    def _engine_work(self) -> None:
        """The engine's timings since the last call, counted and traced (runtime/recording.py)."""
        self._recorder.engine_work(self.stats, self.engine.timings(), self._clock.run_s)

    # ================================================================== public
    def request_stop(self) -> None:
        """Checkpoint and end the run at the next step boundary (SIGTERM handler)."""
        self._stop = True
        if self._tasks is not None:
            self._tasks.spawn(self._stop_if_idle)

    def on_requests_lost(self, request_ids: list[str]) -> None:
        """The engine's `on_lost` callback (a worker died): regenerate their groups, in a task under the lock."""
        self._tasks.spawn(self._regenerate_lost, list(request_ids))

    async def run(self) -> RunResult:
        self._clock.start(self.stats)
        self._tasks = TaskSupervisor()
        self._steps.idle()
        self._recorder.start(self.step, self.stats.tokens_generated)
        await self.engine.start()
        try:
            if self.version:  # a resumed run: the engine starts on the trainer's weights
                self.stats.add_push(await self._steps.publish(self.engine, self.version))
            self._tasks.spawn(self._read_outputs)
            if self._watch.enabled:
                self._tasks.spawn(watch_stalls, self._watch, self)
            self._tasks.spawn(self._begin)
            await self._tasks.wait()
            if self._rewards.failure is not None:
                raise self._rewards.failure
            return await self._result()
        finally:
            await self._tasks.cancel_all()
            await self.engine.stop()
            self._steps.close()
            self.ledger.flush()
            if self._samples is not None:
                self._samples.close()
            self._engine_work()
            self._tracer.flush()

    async def _begin(self) -> None:
        """Regenerate the groups a restart interrupted, then the first admissions; then, before
        the first step, the base model's evaluation (behind those admissions, runtime/evaluation.py)."""
        async with self.lock:
            failed = self.table.failed_rewards()  # scored again before any batch: a fixed function may pass
            for live, result in zip(failed, await score_groups(self.task, self.tokenizer, failed)):
                self._rewards.give(self.stats, live.rollout, result)
            for uid in self.table.lost_on_resume:
                self._regenerate(uid)
            self.table.lost_on_resume = []
            await self.after_event()
            if self.step == 0 and self._evals.due(0):
                await self._evals.submit(self.engine, self.version)
        if self._stop:
            await self._stop_if_idle()

    async def _regenerate_lost(self, request_ids: list[str]) -> None:
        async with self.lock:
            current = {g.rollout.request_id: uid for uid, g in self.table.generating().items()}
            # An episode's turn is a request of its own, "<group request>/<sample>/<turn>" (envs/engine.py).
            request_ids = list(dict.fromkeys(r.split("/", 1)[0] for r in request_ids))
            # Ids of attempts already superseded, dropped or done are stale: nothing to redo.
            for uid in [current[r] for r in request_ids if r in current and self._collector.is_open(r)]:
                self._regenerate(uid)
            await self.after_event()

    def _regenerate(self, uid: int) -> None:
        """The fault path for one generating group: discard its pieces, apply the policy's
        re-admission (or drop). A policy that does neither would lose the group: an error."""
        self._collector.close(self.table.groups[uid].rollout)  # late pieces of this attempt are ignored from now on
        self.table.lose(uid)
        self._recorder.lost(self.table.groups[uid].rollout)
        self._apply(self.policy.on_group_lost(uid=uid, prefix_kept=False, now=self.now()), "on_group_lost")
        if self.table.is_lost(uid):
            raise RuntimeError(f"policy {self.policy.name}: on_group_lost(uid={uid}) neither re-admitted nor "
                               "dropped the group; it would be lost")

    # The StallHost hooks (runtime/liveness.py watch_stalls), called under the lock.
    def ended(self) -> bool:
        return self._stop or self._tasks.done.is_set()

    def generating(self) -> list[tuple[int, str, bool]]:
        return [(uid, g.rollout.request_id, g.rollout.started) for uid, g in self.table.generating().items()]

    async def save_if_idle(self) -> None:
        if not self._training:
            await self.save_checkpoint()

    def regenerate_stalled(self, uid: int) -> None:
        self.stats.groups_stalled += 1
        self._regenerate(uid)

    async def after_event(self) -> None:
        """Send the engine calls of the decisions just applied, then admit and select again."""
        await self._outbox.flush()
        await self._settle()

    async def _result(self) -> RunResult:
        self.stats = await self._stats_now()
        RewardErrorLog.report(self.stats.reward_errors_by_type)
        return RunResult(self.step, self.step >= self.cfg.steps, self.stats, self.stats.elapsed_s,
                         self.stats.trainer_busy_s, self.stats.generator_busy_s)

    async def _stats_now(self) -> RunStats:
        """`self.stats` with the run's wall time and busy seconds up to now (runtime/clock.py)."""
        return await self._clock.totals(self.stats, self.engine)

    # ================================================================== decisions
    def _apply(self, d: Decision, call: str) -> None:
        """Apply a decision through `planner.driver.apply_decision`, the controller being its host. Engine
        calls are queued in the outbox and sent by its `flush`: applying never yields half-way."""
        apply_decision(self, d, call=call, policy=self.policy.name)

    # The DecisionHost hooks (planner.driver); apply_decision has checked each uid.
    def held(self, uid: int) -> GroupState | None:
        return self.table.state(uid)

    def record_moves(self, moves: list[Move]) -> None:
        self.ledger.moves(moves)

    def mark_critical(self, uids: list[int]) -> None:
        self._tail.mark_critical(uids)

    def migrate_groups(self, uids: list[int]) -> None:
        self._tail.migrate_groups(uids)

    def admit_group(self, a: Admission) -> None:
        live = self.table.groups.get(a.uid)
        if live is None:  # a candidate
            prompt, attempt = self.table.take_candidate(a.uid), 0
            self.stats.groups_admitted += 1
        else:  # a lost group, regenerated from scratch under a new request id
            self._collector.close(live.rollout)
            self._outbox.abort(live.rollout.request_id)
            prompt, attempt = live.prompt, live.rollout.attempt + 1
            self.stats.groups_readmitted += 1
        rollout = self._collector.open(a.uid, prompt.prompt_id, prompt.prompt_ids, self.cfg.group_size, attempt)
        self.table.groups[a.uid] = LiveGroup(prompt, rollout)  # RUNNING (no longer LOST)
        self._recorder.admitted(a, prompt, rollout)
        # Held until the engine holds `a.version`, the start barrier (Admission docs).
        self._outbox.submit(group_request(self.cfg, self.task.cfg, prompt, rollout, self.stop_token_ids, a.priority,
                                          episodes=self.task.multi_turn), barrier=a.version)

    def drop_group(self, d: Drop) -> None:
        live = self.table.groups.pop(d.uid)
        if live.state == GroupState.LOST or live.generating:  # its request may still be at the engine
            self._collector.close(live.rollout)
            self._outbox.abort(live.rollout.request_id)
        self._recorder.dropped(self.stats, d, live.rollout.tokens)
        self._ask = True

    async def _settle(self) -> None:
        """Admit and (while the trainer waits) select until the policy changes nothing more."""
        if self.ended():
            return
        while True:
            self.table.refill(self.stream)
            d = self.policy.admit(now=self.now(), candidates=self.table.candidates())
            self._apply(d, "admit")
            changed = bool(d.admit or d.drop)
            if not self._training and self._ask and self.step < self.cfg.steps:
                self._ask = False
                d = self.policy.select_batch(step=self.step, now=self.now())
                self._apply(d, "select_batch")
                changed = changed or bool(d.drop) or d.train is not None
            await self._outbox.flush()
            if not changed:
                break
        if not self._training and not self.groups_in_flight() and self.step < self.cfg.steps:
            raise self.table.deadlock(self.policy.name, self.step)

    def groups_in_flight(self) -> int:
        return self.table.in_flight()

    # ================================================================== generation events
    async def _read_outputs(self) -> None:
        async for piece in self.engine.outputs():
            async with self.lock:
                if is_eval_request(piece.request_id):  # never a rollout: no policy event, no ledger line
                    self._watch.piece(None, self.now())
                    finished = self._evals.add(piece)
                    if finished is not None:
                        self._tasks.spawn(self._finish_eval, finished)
                    continue
                event = self._collector.add(piece)
                self._watch.piece(piece.request_id if event is not None else None, self.now())
                if event is None:
                    continue  # a dropped or superseded request
                group, now = event.group, self.now()
                self.stats.tokens_generated += sum(c for _, c in event.new_tokens)
                if event.started_version is not None:
                    self._recorder.started(group, event.started_version, self.engine.worker_of(piece.request_id))
                    self._apply(self.policy.on_group_started(uid=group.uid, version=event.started_version, now=now),
                                "on_group_started")
                if event.group_done:
                    self._recorder.finished(self.stats, group)
                    live = self.table.groups[group.uid]
                    live.scoring = True  # still RUNNING for the policy until on_group_finished
                    self._tasks.spawn(self._score, live)
                else:
                    for version, count in event.new_tokens:
                        self._apply(self.policy.on_tokens(uid=group.uid, version=version, tokens=count, now=now),
                                    "on_tokens")
                await self.after_event()

    async def _score(self, live: LiveGroup) -> None:
        result = await score_group(self.task, self.tokenizer, live.prompt, live.rollout)
        async with self.lock:
            rollout = live.rollout
            if self.table.groups.get(rollout.uid) is not live:
                return  # dropped while scoring
            if not self._rewards.give(self.stats, rollout, result):
                return  # too many failed: the run stops before the policy hears of the group
            live.state, live.scoring = GroupState.DONE, False
            self._ask = True
            self._apply(self.policy.on_group_finished(uid=rollout.uid, versions=rollout.token_versions(),
                                                      now=self.now(), last_versions=rollout.last_versions()),
                        "on_group_finished")
            await self.after_event()

    # ================================================================== training
    def train_batch(self, uids: list[int]) -> None:
        step = self.step
        lives = [self.table.groups.pop(uid) for uid in uids]
        groups = [live.rollout for live in lives]
        self._recorder.handed_over(step, groups)
        if self._samples is not None:
            self._samples.write(step, [(live.prompt, live.rollout) for live in lives])
        self._training = True
        self._tasks.spawn(self._train, step, groups)

    async def _train(self, step: int, groups: list[GroupRollout]) -> None:
        """Train step `step` on `groups`, tell the policy, record the step; then publish its weights."""
        trained = await self._steps.train(step, groups)
        version = step + 1
        async with self.lock:
            self._recorder.trained(self.stats, groups, trained)
            self.step = version
            self._apply(self.policy.on_step_done(step=step, now=self.now()), "on_step_done")
            last = self.step >= self.cfg.steps
            self._recorder.traced(step, groups, trained.timing)
            if not last:
                self._tracer.event("publish", version=version)
                self._apply(self.policy.on_version_published(version=version, now=self.now()), "on_version_published")
            await self._outbox.flush()
            self._recorder.flush_durable()  # the ledger before the metrics record (runtime/recording.py)
            if self._samples is not None:
                self._samples.flush()
            self._recorder.count(self.stats, self.engine.timings())  # the record's totals: every iteration so far
            self._recorder.record(step, await self._stats_now(), groups, trained, engine=EngineLoad.of(
                await self.engine.stats()), inflight_groups=self.groups_in_flight(), done_groups=self.table.done(),
                extra=self._evals.take_pending())
        if not last:  # the trainer's weights to the engine; returns once it holds them
            self.stats.add_push(await self._steps.publish(self.engine, version))
        async with self.lock:
            if not last:
                await self._synced(version)
            else:
                self._engine_work()
            await self._step_ended(last)

    async def _synced(self, version: int) -> None:
        """The engine holds `version` (under the lock): release the requests whose start barrier it
        meets, tell the policy, and start a due evaluation."""
        self._tracer.event("synced", version=version)
        self._engine_work()
        self._outbox.synced_to(version, still_wanted=self._collector.is_open)
        self._apply(self.policy.on_version_synced(version=version, now=self.now()), "on_version_synced")
        stats = await self.engine.stats()
        self._apply(self.policy.on_engine_stats(kv_usage=EngineLoad.of(stats).usage, queued=stats.queued,
                                                now=self.now()), "on_engine_stats")
        if self._evals.due(self.step):
            await self._evals.submit(self.engine, version)

    async def _step_ended(self, last: bool) -> None:
        """The trainer is free (under the lock): end the run at its last step or a stop, else
        checkpoint when due and admit and select again."""
        self._training = False
        self._ask = True
        self._steps.idle()
        if last or self._stop:
            if last:  # a stop keeps the untrained groups for the resume instead
                self._apply(self.policy.finish(now=self.now()), "finish")
            await self._outbox.flush()
            await self.save_checkpoint()
            self._tasks.finish()
            return
        if self.checkpointer is not None and self.checkpointer.due(self.step):
            await self.save_checkpoint()
        await self.after_event()
        # Durable up to this completed step (and the next step's admissions): a SIGKILL from
        # here on loses at most the step in progress (docs/fault_tolerance.md).
        self._recorder.flush_durable()

    async def _finish_eval(self, evaluation: EngineEval) -> None:
        figures = await evaluation.score(self.task, self.tokenizer, self.cfg.eval.pass_threshold)
        async with self.lock:
            self._evals.finished(evaluation, figures)

    async def _stop_if_idle(self) -> None:
        """A stop while the trainer waits for a batch: checkpoint now (a running step saves at its end)."""
        async with self.lock:
            if not self._training and not self._tasks.done.is_set():
                await self.save_checkpoint()
                self._tasks.finish()

    # ================================================================== checkpoints
    def snapshot(self, stats: RunStats | None = None) -> ControllerSnapshot:
        """The controller, its policy and its stream at a step boundary (between the events, under
        the lock). `stats`: the run's totals up to now (default: `self.stats`). The snapshot copies
        what the run goes on changing."""
        return ControllerSnapshot(
            run=dict(self.run_config_meta), step=self.step, version=self.version, next_uid=self.table.next_uid,
            policy=self.policy.state_dict(), stream=self.stream.state_dict(),
            window=self.table.saved_window(), groups=self.table.saved_groups(),
            stats=copy.deepcopy(self.stats if stats is None else stats),
            **file_lengths(self.run_dir, traced=self.trace is not None))

    def restore(self, snap: ControllerSnapshot) -> None:
        """Continue from `snap` (the trainer is restored by the caller). Groups that were generating
        or being scored at the save lost their engine: they are regenerated when the run starts,
        through the planner's fault path."""
        self.step, self.version = snap.step, snap.version
        self.policy.load_state_dict(snap.policy)
        self.stream.load_state_dict(snap.stream)
        self.table.restore(snap)
        self.stats = copy.deepcopy(snap.stats)

    async def save_checkpoint(self) -> None:
        """Save at a step boundary (between the events, under the lock): see `runtime.state`."""
        if self.checkpointer is None:
            return
        self._recorder.flush_durable()
        if self._samples is not None:
            self._samples.flush()
        meta = to_json(self.snapshot(await self._stats_now()))
        self.checkpointer.save(self.step, self.trainer.state_dict(), meta)
        self.trainer.lend(self.checkpointer.wait_written)  # the next step donates what the save reads

    def load_checkpoint_meta(self, meta: dict[str, Any]) -> None:
        """`restore` from a checkpoint's JSON object (`runtime.state`)."""
        self.restore(from_json(meta))
