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

Faults: an engine that loses requests (a Ray generation worker died, cluster/ray.py) reports
their ids to `on_requests_lost`; each still-generating group goes through the planner's fault
path, `on_group_lost(prefix_kept=False)`: its collected pieces are discarded and the returned
re-admission (a new request id, with its start barrier `Admission.version`) is submitted, so the
group is regenerated from scratch, the bound holds and nothing is dropped.

Stalls (`rollout.stall_timeout_s`, runtime/liveness.py): a watchdog task asks a `StallWatch`, fed
with every submission and every piece, which generating groups streamed no token for that long;
each goes through the same fault path, with one warning line, counted as `groups_stalled`. An
engine that streams nothing through `rollout.max_quiet_stalls` stall rounds hangs: the run saves a
checkpoint (when no step is training) and ends with a one-line `EngineHungError`.

Timing trace (`trace`, planner/run_trace.py, docs/calibration.md): every admission, start, finish,
loss and drop of a group, every step (batch handed over, optimizer step, publish), every push
(each worker's load, the push's return) and the engine's iterations, in run seconds — what
`planner.calibrate` fits the simulator to. It is flushed with the ledger and cut back with it on
resume (`trace_bytes` in the checkpoint).

Stopping: `request_stop()` (SIGTERM, SIGINT) lets a running step finish, saves a checkpoint and ends the
run without `policy.finish`; groups still generating are re-admitted on resume through the
planner's fault path (`on_group_lost(prefix_kept=False)`), done ones keep their samples.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import logging
import time
import zlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jaxrl_async.checkpoint import Checkpointer
from jaxrl_async.engines.base import EngineStats, GenerationEngine, GenerationRequest, SamplingParams
from jaxrl_async.runtime.batching import batch_staleness, make_train_batch
from jaxrl_async.runtime.config import RunConfig
from jaxrl_async.runtime.evaluation import EngineEval, is_eval_request
from jaxrl_async.runtime.liveness import StallWatch
from jaxrl_async.runtime.metrics import METRICS_FILE, EngineLoad, MetricsSink, RunStats, StepTiming, step_record
from jaxrl_async.runtime.rollouts import GroupRollout, RolloutCollector
from jaxrl_async.runtime.scoring import RewardErrorLog, score_group
from jaxrl_async.runtime.state import ControllerSnapshot, SavedGroup, from_json, to_json
from jaxrl_async.tasks.base import Prompt, Task
from jaxrl_async.tokenizer import Tokenizer
from jaxrl_async.trainer.trainer import Trainer
from planner.driver import apply_decision
from planner.ledger import LEDGER_FILE, LedgerWriter
from planner.tools.run_trace import TRACE_FILE, TraceWriter, during_steps
from planner.types import Admission, Candidate, Decision, Drop, GroupState, Move

GENERATING, SCORING, DONE = "generating", "scoring", "done"
log = logging.getLogger(__name__)


@dataclass
class LiveGroup:
    """An admitted, untrained group: its prompt and its current attempt's samples."""

    prompt: Prompt
    rollout: GroupRollout
    phase: str = GENERATING


@dataclass(frozen=True)
class RunResult:
    steps_done: int
    completed: bool  # all `steps` trained (False: stopped for a checkpoint)
    stats: RunStats
    elapsed_s: float
    trainer_busy_s: float
    generator_busy_s: float


def _load(stats: EngineStats) -> EngineLoad:
    """Active sequences per replica (one entry for a single engine) and slots in use."""
    return EngineLoad(list(stats.extra.get("per_replica_active", [stats.active_slots])),
                      stats.active_slots / max(1, stats.total_slots))


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
        self.version = 0  # newest version the engine holds (= synced)
        self.next_uid = 0
        self.window: list[tuple[Candidate, Prompt]] = []  # stream order
        self.groups: dict[int, LiveGroup] = {}
        self._lost_on_resume: list[int] = []
        self._lost: set[int] = set()  # reported to on_group_lost, not re-admitted or dropped yet
        self._collector = RolloutCollector()
        self._mutex = asyncio.Lock()
        self._training = False  # a step is training or publishing
        self._ask = True  # something changed since the last select_batch
        self._stop = False
        self._done: asyncio.Event | None = None
        self._error: BaseException | None = None
        self._tasks: set[asyncio.Task] = set()
        self._commands: list[tuple[str, Any]] = []  # engine calls of the decision being applied
        self._held: list[tuple[int, GenerationRequest]] = []  # (start barrier, request) until synced
        # Train steps get a thread of their own: slow user reward functions fill the default pool.
        self._train_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="train-step")
        self._t0 = 0.0
        self._engine_t0 = 0.0
        self._segment_first_step = 0
        self._busy_at_start = (0.0, 0.0)  # (trainer, generator) busy seconds of earlier segments
        self._trainer_busy_s = 0.0  # this segment
        self._last_record = (0.0, 0)  # (now, tokens generated) at the previous step record
        self._step_wait_since = 0.0
        self._watch = StallWatch(cfg.rollout)
        # Held-out evaluation on the engine (runtime/evaluation.py): the prompts, the running one,
        # the figures waiting for the next step record, and the last figures (summary.json).
        self._eval_prompts = list(eval_prompts or [])
        self._eval: EngineEval | None = None
        self._eval_pending: dict[str, Any] = {}
        self.last_eval: dict[str, Any] | None = None
        self._reward_log = RewardErrorLog()
        self.trace = trace
        self.trace_meta = dict(trace_meta or {})  # the `run` line's engine and planner settings
        self._handed_at = 0.0  # run seconds when the batch in training was handed over
        # (handed over, published) run seconds of the steps since the engine's timings were last
        # traced: iterations inside one are traced apart (`"train": true`, the colocation fit).
        self._train_windows: list[tuple[float, float]] = []

    # ================================================================== time
    def now(self) -> float:
        """Seconds since the run began, earlier segments of a resumed run included."""
        return self.stats.elapsed_s + (time.monotonic() - self._t0)

    def _trace(self, event: str, **fields: Any) -> None:
        if self.trace is not None:
            self.trace.write(event, self.now(), **fields)

    def _trace_engine(self) -> None:
        """The engine's timings since the last call: each load, and the iterations aggregated.
        Drained even without a trace, so that the engine does not keep them for the whole run."""
        timings, windows = self.engine.timings(), self._train_windows
        # Later iterations begin after these steps ended; the step that is training now, if any
        # (a run's end), is appended when it publishes.
        self._train_windows = []
        if self.trace is None:
            return
        decode = []
        for e in timings:
            t = self.stats.elapsed_s + (e.t - self._t0)
            if e.kind == "load":
                self.trace.write("load", t, version=e.version, worker=e.worker, s=round(e.seconds, 6))
            else:
                decode.append((e.worker, e.seconds, e.steps, e.tokens, e.prefill_tokens, e.compiled,
                               during_steps(t, e.seconds, windows)))
        self.trace.decode(self.now(), decode)

    def _flush_durable(self) -> None:
        """fsync the ledger and the trace (docs/fault_tolerance.md): at step ends and saves."""
        self.ledger.flush(sync=True)
        if self.trace is not None:
            self.trace.flush(sync=True)

    # ================================================================== public
    def request_stop(self) -> None:
        """Checkpoint and end the run at the next step boundary (SIGTERM handler)."""
        self._stop = True
        if self._done is not None:
            self._spawn(self._stop_if_idle)

    def on_requests_lost(self, request_ids: list[str]) -> None:
        """The engine lost these requests (their worker died): regenerate their groups (the
        engine's `on_lost` callback; runs on the event loop, the work is a task under the lock)."""
        self._spawn(self._regenerate_lost, list(request_ids))

    async def run(self) -> RunResult:
        self._t0 = time.monotonic()
        self._done = asyncio.Event()
        self._busy_at_start = (self.stats.trainer_busy_s, self.stats.generator_busy_s)
        self._step_wait_since = self.now()
        self._last_record = (self.now(), self.stats.tokens_generated)
        self._segment_first_step = self.step
        self._engine_t0 = time.monotonic()
        self._trace("run", step=self.step, **self.trace_meta)
        await self.engine.start()
        try:
            if self.version:
                await self._push(self.version)
            self._spawn(self._read_outputs)
            if self._watch.enabled:
                self._spawn(self._watch_stalls)
            self._spawn(self._begin)
            await self._done.wait()
            if self._error is not None:
                raise self._error
            return await self._result()
        finally:
            for task in list(self._tasks):
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)
            await self.engine.stop()
            self._train_thread.shutdown(wait=True)
            self.ledger.flush()
            self._trace_engine()
            if self.trace is not None:
                self.trace.flush()

    async def _begin(self) -> None:
        """Regenerate the groups a restart interrupted, then the first admissions."""
        async with self._mutex:
            for uid in self._lost_on_resume:
                self._regenerate(uid)
            self._lost_on_resume = []
            await self._flush_engine_commands()
            await self._settle()
        if self._stop:
            await self._stop_if_idle()

    async def _regenerate_lost(self, request_ids: list[str]) -> None:
        async with self._mutex:
            current = {g.rollout.request_id: uid for uid, g in self.groups.items() if g.phase == GENERATING}
            # Ids of attempts already superseded, dropped or done are stale: nothing to redo.
            for uid in [current[r] for r in request_ids if r in current and self._collector.is_open(r)]:
                self._regenerate(uid)
            await self._flush_engine_commands()
            await self._settle()

    def _regenerate(self, uid: int) -> None:
        """The fault path for one generating group: discard its pieces, apply the policy's
        re-admission (or drop). A policy that does neither would lose the group: an error."""
        self._collector.close(self.groups[uid].rollout)  # late pieces of this attempt are ignored from now on
        self._lost.add(uid)
        self._trace("lost", uid=uid, attempt=self.groups[uid].rollout.attempt)
        self._apply(self.policy.on_group_lost(uid=uid, prefix_kept=False, now=self.now()), "on_group_lost")
        if uid in self._lost:
            raise RuntimeError(f"policy {self.policy.name}: on_group_lost(uid={uid}) neither re-admitted nor "
                               "dropped the group; it would be lost")

    async def _watch_stalls(self) -> None:
        """Every `period_s`: regenerate the groups that stalled (see runtime/liveness.py)."""
        while True:
            await asyncio.sleep(self._watch.period_s)
            async with self._mutex:
                if self._stop or self._done.is_set():
                    return
                now = self.now()
                stall_round = self._watch.check(now, [
                    (uid, g.rollout.request_id, g.rollout.started) for uid, g in self.groups.items()
                    if g.phase == GENERATING and uid not in self._lost])
                if stall_round is None:
                    continue
                if self._watch.hung:
                    if not self._training:
                        await self.save_checkpoint()
                    raise self._watch.hung_error(now, self.groups_in_flight())
                for stall in stall_round.stalls:
                    self.stats.groups_stalled += 1
                    log.warning("rollout stalled: group %d (request %s) streamed no token for %.1f s%s; "
                                "regenerating it through the fault path", stall.uid, stall.request_id,
                                stall.idle_s, " (the engine streamed nothing either)" if stall_round.quiet else "")
                    self._regenerate(stall.uid)
                await self._flush_engine_commands()
                await self._settle()

    async def _result(self) -> RunResult:
        self.stats = await self._stats_now()
        RewardErrorLog.report(self.stats.reward_errors_by_type)
        return RunResult(self.step, self.step >= self.cfg.steps, self.stats, self.stats.elapsed_s,
                         self.stats.trainer_busy_s, self.stats.generator_busy_s)

    async def _stats_now(self) -> RunStats:
        """`self.stats` with this segment's wall time and busy seconds added."""
        stats = dataclasses.replace(self.stats)
        stats.elapsed_s = self.now()
        stats.trainer_busy_s = self._busy_at_start[0] + self._trainer_busy_s
        stats.generator_busy_s = self._busy_at_start[1] + await self._engine_busy_s()
        return stats

    async def _engine_busy_s(self) -> float:
        """Seconds the engine spent generating in this segment (its busy fraction since its start)."""
        return (await self.engine.stats()).busy_fraction * (time.monotonic() - self._engine_t0)

    # ================================================================== tasks
    def _spawn(self, fn, *args) -> None:
        """Run `fn(*args)` as a task whose failure ends the run (the coroutine is made inside the
        task, so a task cancelled before it starts leaves no never-awaited coroutine behind)."""
        task = asyncio.get_running_loop().create_task(self._guard(fn, *args))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _guard(self, fn, *args) -> None:
        try:
            await fn(*args)
        except asyncio.CancelledError:
            raise
        except BaseException as error:  # noqa: BLE001 - any failure ends the run, re-raised by run()
            if self._error is None:
                self._error = error
            self._done.set()

    # ================================================================== decisions
    def _apply(self, d: Decision, call: str) -> None:
        """Apply a decision through `planner.driver.apply_decision` (moves to the ledger, drops, the
        batch, admissions in order), the controller being its host.

        Engine calls are queued in `self._commands` and sent by `_flush_engine_commands`, so that
        applying a decision never yields to another event half-way.
        """
        apply_decision(self, d, call=call, policy=self.policy.name)

    # The DecisionHost hooks (planner.driver); apply_decision has checked each uid.
    def held(self, uid: int) -> GroupState | None:
        live = self.groups.get(uid)
        if live is None:
            return GroupState.CANDIDATE if any(c.uid == uid for c, _ in self.window) else None
        if uid in self._lost:
            return GroupState.LOST
        return GroupState.DONE if live.phase == DONE else GroupState.RUNNING

    def record_moves(self, moves: list[Move]) -> None:
        self.ledger.moves(moves)

    def _queue(self, kind: str, payload: Any) -> None:
        self._commands.append((kind, payload))

    async def _flush_engine_commands(self) -> None:
        commands, self._commands = self._commands, []
        for kind, payload in commands:
            if kind == "submit":
                await self.engine.submit(payload)
                self._watch.submitted(payload.request_id, self.now())
            else:
                await self.engine.abort(payload)

    def admit_group(self, a: Admission) -> None:
        live = self.groups.get(a.uid)
        if live is None:  # a candidate
            index = next(i for i, (c, _) in enumerate(self.window) if c.uid == a.uid)
            _, prompt = self.window.pop(index)
            attempt = 0
            self.stats.groups_admitted += 1
        else:  # a lost group, regenerated from scratch under a new request id
            self._lost.discard(a.uid)
            self._collector.close(live.rollout)
            self._queue("abort", live.rollout.request_id)
            prompt, attempt = live.prompt, live.rollout.attempt + 1
            self.stats.groups_readmitted += 1
        n = self.cfg.group_size
        rollout = self._collector.open(a.uid, prompt.prompt_id, prompt.prompt_ids, n, attempt)
        self.groups[a.uid] = LiveGroup(prompt, rollout)
        self.ledger.admit(a)
        self._trace("admit", uid=a.uid, attempt=attempt, prompt_id=prompt.prompt_id,
                    prompt_tokens=len(prompt.prompt_ids), version=a.version)
        sampling = SamplingParams(
            max_new_tokens=self.cfg.max_new_tokens, temperature=self.cfg.temperature, top_p=self.cfg.top_p,
            stop_token_ids=self.stop_token_ids, n=n, seed=sampling_seed(self.cfg.seed, a.uid, attempt))
        request = GenerationRequest(rollout.request_id, list(prompt.prompt_ids), sampling, a.priority)
        if a.version > self.version:  # a start barrier (Admission docs): wait for those weights
            self._held.append((a.version, request))
        else:
            self._queue("submit", request)

    def _release_held(self) -> None:
        """Submit held requests whose start barrier the engine's weights now meet."""
        ready = [r for v, r in self._held if v <= self.version]
        self._held = [(v, r) for v, r in self._held if v > self.version]
        for request in ready:
            if self._collector.is_open(request.request_id):  # not dropped meanwhile
                self._queue("submit", request)

    def drop_group(self, d: Drop) -> None:
        live = self.groups.pop(d.uid)
        self._lost.discard(d.uid)
        if live.phase == GENERATING:
            self._collector.close(live.rollout)
            self._queue("abort", live.rollout.request_id)
        tokens = live.rollout.tokens
        self.ledger.drop(d, tokens)
        self._trace("drop", uid=d.uid)
        self.stats.groups_dropped += 1
        self.stats.tokens_wasted += tokens
        self._ask = True

    def _refill_window(self) -> None:
        while len(self.window) < self.cfg.window:
            prompt = next(self.stream)
            self.window.append((_candidate(self.next_uid, prompt), prompt))
            self.next_uid += 1

    async def _settle(self) -> None:
        """Admit and (while the trainer waits) select until the policy changes nothing more."""
        if self._stop or self._done.is_set():
            return
        while True:
            self._refill_window()
            d = self.policy.admit(now=self.now(), candidates=[c for c, _ in self.window])
            self._apply(d, "admit")
            changed = bool(d.admit or d.drop)
            if not self._training and self._ask and self.step < self.cfg.steps:
                self._ask = False
                d = self.policy.select_batch(step=self.step, now=self.now())
                self._apply(d, "select_batch")
                changed = changed or bool(d.drop) or d.train is not None
            await self._flush_engine_commands()
            if not changed:
                break
        if not self._training and not self.groups_in_flight() and self.step < self.cfg.steps:
            raise RuntimeError(
                f"policy {self.policy.name}: the trainer waits for step {self.step} but nothing is generating "
                f"or being scored ({sum(g.phase == DONE for g in self.groups.values())} done groups, "
                f"{len(self.window)} candidates refused): deadlock")

    def groups_in_flight(self) -> int:
        return sum(g.phase != DONE for g in self.groups.values())

    # ================================================================== generation events
    async def _read_outputs(self) -> None:
        async for piece in self.engine.outputs():
            async with self._mutex:
                if is_eval_request(piece.request_id):  # never a rollout: no policy event, no ledger line
                    self._watch.piece(None, self.now())
                    if self._eval is not None and self._eval.add(piece):
                        self._spawn(self._finish_eval, self._eval)
                    continue
                event = self._collector.add(piece)
                self._watch.piece(piece.request_id if event is not None else None, self.now())
                if event is None:
                    continue  # a dropped or superseded request
                group, now = event.group, self.now()
                self.stats.tokens_generated += sum(c for _, c in event.new_tokens)
                if event.started_version is not None:
                    self.ledger.start(group.uid, event.started_version)
                    self._trace("start", uid=group.uid, attempt=group.attempt, version=event.started_version,
                                worker=self.engine.worker_of(piece.request_id))
                    self._apply(self.policy.on_group_started(uid=group.uid, version=event.started_version, now=now),
                                "on_group_started")
                if event.group_done:
                    self._trace("finish", uid=group.uid, attempt=group.attempt,
                                lengths=[len(s.token_ids) for s in group.samples])
                    self.groups[group.uid].phase = SCORING
                    self._spawn(self._score, self.groups[group.uid])
                else:
                    for version, count in event.new_tokens:
                        self._apply(self.policy.on_tokens(uid=group.uid, version=version, tokens=count, now=now),
                                    "on_tokens")
                await self._flush_engine_commands()
                await self._settle()

    async def _score(self, live: LiveGroup) -> None:
        result = await score_group(self.task, self.tokenizer, live.prompt, live.rollout)
        async with self._mutex:
            rollout = live.rollout
            if self.groups.get(rollout.uid) is not live:
                return  # dropped while scoring
            rollout.rewards, rollout.reward_errors = result.rewards, len(result.errors)
            self.stats.rewards_scored += len(result.rewards)
            self.stats.reward_errors += len(result.errors)
            self._reward_log.record(self.stats.reward_errors_by_type, rollout.uid, result.errors)
            live.phase = DONE
            self._ask = True
            self._apply(self.policy.on_group_finished(uid=rollout.uid, versions=rollout.token_versions(),
                                                      now=self.now(), last_versions=rollout.last_versions()),
                        "on_group_finished")
            await self._flush_engine_commands()
            await self._settle()

    # ================================================================== training
    def train_batch(self, uids: list[int]) -> None:
        step = self.step
        groups = [self.groups.pop(uid).rollout for uid in uids]
        self.ledger.train(step, [(g.uid, g.token_versions()) for g in groups])
        self._handed_at = self.now()
        self._training = True
        self._spawn(self._train, step, groups)

    async def _train(self, step: int, groups: list[GroupRollout]) -> None:
        wait_s = self.now() - self._step_wait_since
        batch = make_train_batch(groups, rows_multiple=self.trainer.rows_multiple)
        gen0, t0, start_s = await self._engine_busy_s(), time.monotonic(), self.now()
        metrics = await asyncio.get_running_loop().run_in_executor(self._train_thread, self.trainer.step, batch)
        train_s = time.monotonic() - t0
        overlap_s = await self._engine_busy_s() - gen0  # generation while the trainer trained
        self._trainer_busy_s += train_s
        self.stats.overlap_s += overlap_s
        hist = batch_staleness(step, groups)
        async with self._mutex:
            self.stats.add_batch(hist)
            self.stats.groups_trained += len(groups)
            self.stats.steps_done += 1
            self.stats.steps_skipped += int(metrics["skipped"])
            self.step = step + 1
            version = step + 1
            self._apply(self.policy.on_step_done(step=step, now=self.now()), "on_step_done")
            last = self.step >= self.cfg.steps
            if self.trace is not None:  # at the time the batch was handed over
                self.trace.write("train", self._handed_at, step=step, start=round(start_s, 6),
                                 end=round(start_s + train_s, 6), groups=len(groups),
                                 tokens=sum(len(s.token_ids) for g in groups for s in g.samples),
                                 prompt_tokens=sum(len(g.prompt_ids) * len(g.samples) for g in groups))
            self._train_windows.append((self._handed_at, self.now()))  # the step as the simulator's trainer
            if not last:
                self._trace("publish", version=version)
                self._apply(self.policy.on_version_published(version=version, now=self.now()), "on_version_published")
            await self._flush_engine_commands()
            timing = StepTiming(wait_s, train_s, overlap_s, start_s, start_s + train_s)
            # The ledger before the metrics record: a kill between them leaves metrics.jsonl no
            # longer than the ledger's steps (the audit compares the two).
            self._flush_durable()
            await self._record(step, groups, hist, metrics, timing)
        if not last:
            await self._push(version)
        async with self._mutex:
            if not last:
                self._trace("synced", version=version)
            self._trace_engine()
            if not last:
                self.version = version
                self._release_held()
                self._apply(self.policy.on_version_synced(version=version, now=self.now()), "on_version_synced")
                stats = await self.engine.stats()
                self._apply(self.policy.on_engine_stats(kv_usage=_load(stats).usage, queued=stats.queued,
                                                        now=self.now()), "on_engine_stats")
                if self.cfg.eval.every and self.step % self.cfg.eval.every == 0:
                    await self._start_eval(version)
            self._training = False
            self._ask = True
            self._step_wait_since = self.now()
            if last or self._stop:
                if last:  # a stop keeps the untrained groups for the resume instead
                    self._apply(self.policy.finish(now=self.now()), "finish")
                await self._flush_engine_commands()
                await self.save_checkpoint()
                self._done.set()
                return
            if self.checkpointer is not None and self.checkpointer.due(self.step):
                await self.save_checkpoint()
            await self._flush_engine_commands()
            await self._settle()
            # Durable up to this completed step (and the next step's admissions): a SIGKILL from
            # here on loses at most the step in progress (docs/fault_tolerance.md).
            self._flush_durable()

    async def _start_eval(self, version: int) -> None:
        """Evaluate the weights `version` the engine now holds on the held-out prompts, behind every
        rollout (runtime/evaluation.py). One at a time: a due evaluation while one runs is skipped."""
        if self._eval is not None:
            log.warning("evaluation of version %d skipped: the one of version %d is still running",
                        version, self._eval.version)
            return
        self._eval = EngineEval(self._eval_prompts, version, max_new_tokens=self.cfg.max_new_tokens,
                                stop_token_ids=self.stop_token_ids)
        for request in self._eval.requests():
            await self.engine.submit(request)

    async def _finish_eval(self, evaluation: EngineEval) -> None:
        figures = await evaluation.score(self.task, self.tokenizer, self.cfg.eval.pass_threshold)
        async with self._mutex:
            self._eval = None
            self._eval_pending, self.last_eval = figures, figures
        log.info("eval of version %d: pass@1 %.3f, mean reward %.3f over %d held-out prompts", evaluation.version,
                 figures["eval/pass_at_1"], figures["eval/mean_reward"], figures["eval/n"])

    async def _push(self, version: int) -> None:
        """Publish the trainer's weights as `version` to the engine; returns once it holds them.
        The time from the trainer's layout to every engine replica holding the new weights
        (cast, reshard or gather, install) goes into the run's stats."""
        t0 = time.monotonic()
        await self.engine.update_weights(self.trainer.engine_params(self.engine_dtype), version)
        self.stats.add_push(time.monotonic() - t0)

    async def _stop_if_idle(self) -> None:
        """A stop while the trainer waits for a batch: checkpoint now (a running step saves at its end)."""
        async with self._mutex:
            if not self._training and not self._done.is_set():
                await self.save_checkpoint()
                self._done.set()

    async def _record(self, step: int, groups: list[GroupRollout], hist: dict[int, int],
                      metrics: dict[str, float], timing: StepTiming) -> None:
        """One metrics record per step, to every sink (metrics.jsonl, TensorBoard, progress)."""
        stats = await self._stats_now()
        previous, self._last_record = self._last_record, (stats.elapsed_s, stats.tokens_generated)
        segment_steps = self.step - self._segment_first_step
        eta_s = (self.cfg.steps - self.step) * (time.monotonic() - self._t0) / max(1, segment_steps)
        record = step_record(
            step, metrics, hist, [len(s.token_ids) for g in groups for s in g.samples], stats, timing,
            previous=previous, engine=_load(await self.engine.stats()), inflight_groups=self.groups_in_flight(),
            done_groups=sum(g.phase == DONE for g in self.groups.values()), eta_s=eta_s)
        record.update(self._eval_pending)  # the latest finished evaluation, once
        self._eval_pending = {}
        for sink in self.sinks:
            sink.write(record)

    # ================================================================== checkpoints
    def snapshot(self, stats: RunStats | None = None) -> ControllerSnapshot:
        """The controller, its policy and its stream at a step boundary (between the events, under
        the lock). `stats`: the run's totals up to now (default: `self.stats`). The snapshot copies
        what the run goes on changing."""
        return ControllerSnapshot(
            run=dict(self.run_config_meta), step=self.step, version=self.version, next_uid=self.next_uid,
            policy=self.policy.state_dict(), stream=self.stream.state_dict(),
            window=tuple((c.uid, p) for c, p in self.window),
            groups=tuple(SavedGroup(g.prompt, g.phase, copy.deepcopy(g.rollout)) for g in self.groups.values()),
            stats=copy.deepcopy(self.stats if stats is None else stats),
            ledger_bytes=_size(self.run_dir / LEDGER_FILE), metrics_bytes=_size(self.run_dir / METRICS_FILE),
            trace_bytes=_size(self.run_dir / TRACE_FILE) if self.trace is not None else None)

    def restore(self, snap: ControllerSnapshot) -> None:
        """Continue from `snap` (the trainer is restored by the caller). Groups that were generating
        or being scored at the save lost their engine: they are regenerated when the run starts,
        through the planner's fault path."""
        self.step, self.version, self.next_uid = snap.step, snap.version, snap.next_uid
        self.policy.load_state_dict(snap.policy)
        self.stream.load_state_dict(snap.stream)
        self.window = [(_candidate(uid, prompt), prompt) for uid, prompt in snap.window]
        self.stats = copy.deepcopy(snap.stats)
        self.groups = {}
        self._lost_on_resume = []
        for g in snap.groups:
            rollout = copy.deepcopy(g.rollout)
            self.groups[rollout.uid] = LiveGroup(g.prompt, rollout, DONE if g.phase == DONE else GENERATING)
            if g.phase != DONE:
                self._lost_on_resume.append(rollout.uid)

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


def _candidate(uid: int, prompt: Prompt) -> Candidate:
    return Candidate(uid, prompt.prompt_id, len(prompt.prompt_ids))


def _size(path: Path) -> int:
    return path.stat().st_size if path.exists() else 0
