"""The local-mode controller: one process, asyncio for control, threads for device work.

It drives a staleness policy (`planner.base.Policy`) through the same event protocol as the
simulator (`planner.sim.simulator`), with real components behind every event:

    data stream ─► window of Candidates ─► policy.admit ─► engine.submit(priority)
    engine.outputs() ─► first piece: on_group_started(first token's version)
                      ─► more pieces: on_tokens(version, count)
                      ─► all n samples done: rewards ─► on_group_finished(token counts by version)
    trainer idle ─► select_batch(k) ─► TrainBatch ─► Trainer.step in a worker thread
                 ─► on_step_done(k) ─► on_version_published(k+1) ─► engine.update_weights(k+1)
                 ─► on_version_synced(k+1) ─► on_engine_stats
    drops ─► engine.abort + ledger;   run end ─► policy.finish (baselines' end_of_run drops)

After every event `_settle` asks the policy to admit from the window and — while the trainer
waits — to select the next batch, until nothing changes (as the simulator does). Every policy
call and its decision run under one asyncio lock, so the policy sees a sequence of events, never
interleaved ones; device work (generation in the engine's thread, the train step in
`asyncio.to_thread`) overlaps freely.

Versions: version k+1 is published after step k even when the trainer skipped the update (a
non-finite loss): the weights equal v_k then, so labelling them k+1 only makes the ledger's
staleness conservative, and the planner's "step k trains on v_k" stays exact. The engine holds
only published versions and never goes back, so the policy's admission version (the synced
version) is a lower bound of every token's version — the premise of docs/design.md §2.

Faults: an engine that loses requests (a Ray generation worker died, cluster/ray/proxy.py) reports
their ids to `on_requests_lost`; each still-generating group goes through the planner's fault
path, `on_group_lost(prefix_kept=False)`: its collected pieces are discarded and the returned
re-admission (a new request id, with its start barrier `Admission.version`) is submitted, so the
group is regenerated from scratch, the bound holds and nothing is dropped.

The side jobs have modules of their own (runtime/__init__.py lists them); this one keeps the
order of calls. Its groups are runtime/groups.py's table, in the planner's `GroupState`.

Stopping: `request_stop()` (SIGTERM, SIGINT) lets a running step finish, saves a checkpoint and ends the
run without `policy.finish`; groups still generating are re-admitted on resume through the
planner's fault path (`on_group_lost(prefix_kept=False)`), done ones keep their samples.
"""

from __future__ import annotations

import asyncio
import copy
import time
import zlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jaxrl_async.checkpoint import Checkpointer
from jaxrl_async.engines.base import GenerationEngine, GenerationRequest, SamplingParams
from jaxrl_async.runtime.batching import batch_staleness, make_train_batch
from jaxrl_async.runtime.clock import RunClock
from jaxrl_async.runtime.config import RunConfig
from jaxrl_async.runtime.evaluation import EngineEval, EvalScheduler, is_eval_request
from jaxrl_async.runtime.groups import GroupTable, LiveGroup
from jaxrl_async.runtime.liveness import StallWatch, watch_stalls
from jaxrl_async.runtime.metrics import METRICS_FILE, EngineLoad, MetricsSink, RunStats, StepTiming, step_record
from jaxrl_async.runtime.outbox import EngineOutbox
from jaxrl_async.runtime.progress import Eta
from jaxrl_async.runtime.rollouts import GroupRollout, RolloutCollector
from jaxrl_async.runtime.scoring import GroupScore, RewardErrorLog, RewardFailureError, RewardFailureGate, score_group
from jaxrl_async.runtime.state import ControllerSnapshot, from_json, to_json
from jaxrl_async.runtime.supervisor import TaskSupervisor
from jaxrl_async.runtime.tail import TailHooks
from jaxrl_async.runtime.tracing import RunTracer
from jaxrl_async.tasks.base import Prompt, Task
from jaxrl_async.tasks.lengths import sampling_limits
from jaxrl_async.tokenizer import Tokenizer
from jaxrl_async.trainer.trainer import Trainer
from planner.driver import apply_decision
from planner.ledger import LEDGER_FILE, LedgerWriter
from planner.run_trace import TRACE_FILE, TraceWriter
from planner.types import Admission, Decision, Drop, GroupState, Move


@dataclass(frozen=True)
class RunResult:
    steps_done: int
    completed: bool  # all `steps` trained (False: stopped for a checkpoint)
    stats: RunStats
    elapsed_s: float
    trainer_busy_s: float
    generator_busy_s: float


def sampling_seed(seed: int, uid: int, attempt: int) -> int:
    """Sampling seed of one attempt of one group: reproducible, and no RNG state to checkpoint."""
    return zlib.crc32(f"{seed}:{uid}:{attempt}".encode())


class Controller:
    def __init__(self, cfg: RunConfig, *, policy: Any, engine: GenerationEngine, trainer: Trainer, task: Task,
                 tokenizer: Tokenizer, stream: Any, ledger: LedgerWriter, run_dir: str | Path,
                 sinks: list[MetricsSink] = (), checkpointer: Checkpointer | None = None,
                 stop_token_ids: tuple[int, ...] = (), engine_dtype: str = "float32",
                 run_config_meta: dict[str, Any] | None = None, eval_prompts: list[Prompt] | None = None,
                 trace: TraceWriter | None = None, trace_meta: dict[str, Any] | None = None) -> None:
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
        self.engine_dtype = engine_dtype
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
        # Train steps get a thread of their own: slow user reward functions fill the default pool.
        self._train_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="train-step")
        self._clock = RunClock()
        self._last_record = (0.0, 0)  # (now, tokens generated) at the previous step record
        self._step_wait_since = 0.0
        self._eta = Eta(cfg.steps)
        self._evals = EvalScheduler(list(eval_prompts or []), cfg.eval.every, max_new_tokens=cfg.max_new_tokens,
                                    stop_token_ids=self.stop_token_ids)
        self._reward_log = RewardErrorLog()
        self._reward_failure: RewardFailureError | None = None  # the run stops with it (scoring.py)
        self._reward_gate = RewardFailureGate(task.cfg.max_reward_failure_rate, cfg.batch_groups * cfg.group_size)
        self.trace = trace
        self.trace_meta = dict(trace_meta or {})  # the `run` line's engine and planner settings
        self._tracer = RunTracer(trace, self.now)

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

    def _trace_engine(self) -> None:
        self._tracer.engine(self.engine.timings(), self._clock.run_s)

    def _flush_durable(self) -> None:
        """fsync the ledger and the trace (docs/fault_tolerance.md): at step ends and saves."""
        self.ledger.flush(sync=True)
        self._tracer.flush(sync=True)

    # ================================================================== public
    def request_stop(self) -> None:
        """Checkpoint and end the run at the next step boundary (SIGTERM handler)."""
        self._stop = True
        if self._tasks is not None:
            self._tasks.spawn(self._stop_if_idle)

    def on_requests_lost(self, request_ids: list[str]) -> None:
        """The engine lost these requests (their worker died): regenerate their groups (the
        engine's `on_lost` callback; runs on the event loop, the work is a task under the lock)."""
        self._tasks.spawn(self._regenerate_lost, list(request_ids))

    async def run(self) -> RunResult:
        self._clock.start(self.stats)
        self._tasks = TaskSupervisor()
        self._step_wait_since = self.now()
        self._last_record = (self.now(), self.stats.tokens_generated)
        self._tracer.event("run", step=self.step, **self.trace_meta)
        await self.engine.start()
        try:
            if self.version:
                await self._push(self.version)
            self._tasks.spawn(self._read_outputs)
            if self._watch.enabled:
                self._tasks.spawn(watch_stalls, self._watch, self)
            self._tasks.spawn(self._begin)
            await self._tasks.wait()
            if self._reward_failure is not None:
                raise self._reward_failure
            return await self._result()
        finally:
            await self._tasks.cancel_all()
            await self.engine.stop()
            self._train_thread.shutdown(wait=True)
            self.ledger.flush()
            self._trace_engine()
            self._tracer.flush()

    async def _begin(self) -> None:
        """Regenerate the groups a restart interrupted, then the first admissions; then, before
        the first step, the base model's evaluation (behind those admissions, runtime/evaluation.py)."""
        async with self.lock:
            await self._rescore_failed()
            for uid in self.table.lost_on_resume:
                self._regenerate(uid)
            self.table.lost_on_resume = []
            await self.after_event()
            if self.step == 0 and self._evals.due(0):
                await self._start_eval(self.version)
        if self._stop:
            await self._stop_if_idle()

    async def _regenerate_lost(self, request_ids: list[str]) -> None:
        async with self.lock:
            current = {g.rollout.request_id: uid for uid, g in self.table.generating().items()}
            # Ids of attempts already superseded, dropped or done are stale: nothing to redo.
            for uid in [current[r] for r in request_ids if r in current and self._collector.is_open(r)]:
                self._regenerate(uid)
            await self.after_event()

    def _regenerate(self, uid: int) -> None:
        """The fault path for one generating group: discard its pieces, apply the policy's
        re-admission (or drop). A policy that does neither would lose the group: an error."""
        self._collector.close(self.table.groups[uid].rollout)  # late pieces of this attempt are ignored from now on
        self.table.lose(uid)
        self._tracer.event("lost", uid=uid, attempt=self.table.groups[uid].rollout.attempt)
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
        """Apply a decision through `planner.driver.apply_decision` (moves to the ledger, drops, the
        batch, admissions in order), the controller being its host.

        Engine calls are queued in the outbox (runtime/outbox.py) and sent by its `flush`, so that
        applying a decision never yields to another event half-way.
        """
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
        n = self.cfg.group_size
        t = self.task.cfg
        max_new, stops = sampling_limits(t.lengths, t.length_scale, t.length_alpha, prompt.prompt_id,
                                         self.cfg.max_new_tokens, self.stop_token_ids)  # task.lengths
        rollout = self._collector.open(a.uid, prompt.prompt_id, prompt.prompt_ids, n, attempt)
        self.table.groups[a.uid] = LiveGroup(prompt, rollout)  # RUNNING (no longer LOST)
        self.ledger.admit(a)
        self._tracer.event("admit", uid=a.uid, attempt=attempt, prompt_id=prompt.prompt_id,
                           prompt_tokens=len(prompt.prompt_ids), version=a.version)
        sampling = SamplingParams(
            max_new_tokens=max_new, temperature=self.cfg.temperature, top_p=self.cfg.top_p,
            stop_token_ids=stops, n=n, seed=sampling_seed(self.cfg.seed, a.uid, attempt))
        # Held until the engine holds `a.version`, the start barrier (Admission docs).
        self._outbox.submit(GenerationRequest(rollout.request_id, list(prompt.prompt_ids), sampling, a.priority),
                            barrier=a.version)

    def drop_group(self, d: Drop) -> None:
        live = self.table.groups.pop(d.uid)
        if live.state == GroupState.LOST or live.generating:  # its request may still be at the engine
            self._collector.close(live.rollout)
            self._outbox.abort(live.rollout.request_id)
        tokens = live.rollout.tokens
        self.ledger.drop(d, tokens)
        self._tracer.event("drop", uid=d.uid)
        self.stats.groups_dropped += 1
        self.stats.tokens_wasted += tokens
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
            raise RuntimeError(
                f"policy {self.policy.name}: the trainer waits for step {self.step} but nothing is generating "
                f"or being scored ({self.table.done()} done groups, "
                f"{len(self.table.window)} candidates refused): deadlock")

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
                    self.ledger.start(group.uid, event.started_version)
                    self._tracer.event("start", uid=group.uid, attempt=group.attempt, version=event.started_version,
                                worker=self.engine.worker_of(piece.request_id))
                    self._apply(self.policy.on_group_started(uid=group.uid, version=event.started_version, now=now),
                                "on_group_started")
                if event.group_done:
                    self._tracer.event("finish", uid=group.uid, attempt=group.attempt,
                                lengths=[len(s.token_ids) for s in group.samples])
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
            if not self._rewarded(live, result):
                return  # too many failed: the run stops before the policy hears of the group
            live.state, live.scoring = GroupState.DONE, False
            self._ask = True
            self._apply(self.policy.on_group_finished(uid=rollout.uid, versions=rollout.token_versions(),
                                                      now=self.now(), last_versions=rollout.last_versions()),
                        "on_group_finished")
            await self.after_event()

    def _rewarded(self, live: LiveGroup, result: GroupScore) -> bool:
        """Give the group its rewards and count their failures (runtime/scoring.py); False, with the
        run stopping (a checkpoint at the step boundary, then `run` raises), when too many failed."""
        rollout = live.rollout
        rollout.rewards, rollout.reward_errors = result.rewards, len(result.errors)
        self.stats.rewards_scored += len(result.rewards)
        self.stats.reward_errors += len(result.errors)
        self._reward_log.record(self.stats.reward_errors_by_type, rollout.uid, result.errors)
        too_many = self._reward_gate.add(result)
        if too_many is not None:
            self._reward_failure = self._reward_failure or RewardFailureError(
                f"{too_many}; checkpointed: fix the reward function and resume={self.run_dir}")
            self.request_stop()
        return too_many is None

    async def _rescore_failed(self) -> None:
        """A checkpoint's done groups whose rewards failed (the run may have stopped for them) are
        scored again before any batch: a fixed reward function gives them their real rewards."""
        failed = [g for g in self.table.groups.values() if g.state == GroupState.DONE and g.rollout.reward_errors]
        scores = await asyncio.gather(*(score_group(self.task, self.tokenizer, g.prompt, g.rollout) for g in failed))
        for live, result in zip(failed, scores):
            self._rewarded(live, result)

    # ================================================================== training
    def train_batch(self, uids: list[int]) -> None:
        step = self.step
        groups = [self.table.groups.pop(uid).rollout for uid in uids]
        self.ledger.train(step, [(g.uid, g.token_versions()) for g in groups])
        self._tracer.handed_over()
        self._training = True
        self._tasks.spawn(self._train, step, groups)

    async def _train(self, step: int, groups: list[GroupRollout]) -> None:
        wait_s = self.now() - self._step_wait_since
        batch = make_train_batch(groups, rows_multiple=self.trainer.rows_multiple)
        gen0, t0, start_s = await self._clock.engine_busy_s(self.engine), time.monotonic(), self.now()
        metrics = await asyncio.get_running_loop().run_in_executor(self._train_thread, self.trainer.step, batch)
        train_s = time.monotonic() - t0
        overlap_s = await self._clock.engine_busy_s(self.engine) - gen0  # generation while the trainer trained
        self._clock.trained(train_s)
        self.stats.overlap_s += overlap_s
        hist = batch_staleness(step, groups)
        async with self.lock:
            self.stats.add_batch(hist)
            self.stats.groups_trained += len(groups)
            self.stats.steps_done += 1
            self.stats.steps_skipped += int(metrics["skipped"])
            self.step = step + 1
            version = step + 1
            self._apply(self.policy.on_step_done(step=step, now=self.now()), "on_step_done")
            last = self.step >= self.cfg.steps
            self._tracer.step_trained(step, groups, start_s, train_s)
            if not last:
                self._tracer.event("publish", version=version)
                self._apply(self.policy.on_version_published(version=version, now=self.now()), "on_version_published")
            await self._outbox.flush()
            timing = StepTiming(wait_s, train_s, overlap_s, start_s, start_s + train_s)
            # The ledger before the metrics record: a kill between them leaves metrics.jsonl no
            # longer than the ledger's steps (the audit compares the two).
            self._flush_durable()
            await self._record(step, groups, hist, metrics, timing)
        if not last:
            await self._push(version)
        async with self.lock:
            if not last:
                self._tracer.event("synced", version=version)
            self._trace_engine()
            if not last:
                # The engine holds `version`: release the requests whose start barrier it meets.
                self._outbox.synced_to(version, still_wanted=self._collector.is_open)
                self._apply(self.policy.on_version_synced(version=version, now=self.now()), "on_version_synced")
                stats = await self.engine.stats()
                self._apply(self.policy.on_engine_stats(kv_usage=EngineLoad.of(stats).usage, queued=stats.queued,
                                                        now=self.now()), "on_engine_stats")
                if self._evals.due(self.step):
                    await self._start_eval(version)
            self._training = False
            self._ask = True
            self._step_wait_since = self.now()
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
            self._flush_durable()

    async def _start_eval(self, version: int) -> None:
        """Evaluate the weights `version` the engine now holds on the held-out prompts, behind every
        rollout (runtime/evaluation.py)."""
        for request in self._evals.start(version):
            await self.engine.submit(request)

    async def _finish_eval(self, evaluation: EngineEval) -> None:
        figures = await evaluation.score(self.task, self.tokenizer, self.cfg.eval.pass_threshold)
        async with self.lock:
            self._evals.finished(evaluation, figures)

    async def _push(self, version: int) -> None:
        """Publish the trainer's weights as `version` to the engine; returns once it holds them.
        The time from the trainer's layout to every engine replica holding the new weights
        (cast, reshard or gather, install) goes into the run's stats."""
        t0 = time.monotonic()
        await self.engine.update_weights(self.trainer.engine_params(self.engine_dtype), version)
        self.stats.add_push(time.monotonic() - t0)

    async def _stop_if_idle(self) -> None:
        """A stop while the trainer waits for a batch: checkpoint now (a running step saves at its end)."""
        async with self.lock:
            if not self._training and not self._tasks.done.is_set():
                await self.save_checkpoint()
                self._tasks.finish()

    async def _record(self, step: int, groups: list[GroupRollout], hist: dict[int, int],
                      metrics: dict[str, float], timing: StepTiming) -> None:
        """One metrics record per step, to every sink (metrics.jsonl, TensorBoard, progress)."""
        stats = await self._stats_now()
        previous, self._last_record = self._last_record, (stats.elapsed_s, stats.tokens_generated)
        eta_s = self._eta.step_done(self.step, time.monotonic())  # None at the first: it compiled
        record = step_record(
            step, metrics, hist, [len(s.token_ids) for g in groups for s in g.samples], stats, timing,
            previous=previous, engine=EngineLoad.of(await self.engine.stats()), inflight_groups=self.groups_in_flight(),
            done_groups=self.table.done(), eta_s=eta_s)
        record.update(self._evals.take_pending())  # the latest finished evaluation, once
        for sink in self.sinks:
            sink.write(record)

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
            ledger_bytes=_size(self.run_dir / LEDGER_FILE), metrics_bytes=_size(self.run_dir / METRICS_FILE),
            trace_bytes=_size(self.run_dir / TRACE_FILE) if self.trace is not None else None)

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
        self._flush_durable()
        meta = to_json(self.snapshot(await self._stats_now()))
        self.checkpointer.save(self.step, self.trainer.state_dict(), meta)

    def load_checkpoint_meta(self, meta: dict[str, Any]) -> None:
        """`restore` from a checkpoint's JSON object (`runtime.state`)."""
        self.restore(from_json(meta))


def _size(path: Path) -> int:
    return path.stat().st_size if path.exists() else 0
