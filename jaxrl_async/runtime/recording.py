"""The run's record as the controller writes it: the ledger, the timing trace, the run's totals
and one metrics record per step.

`RunRecorder` is the controller's one writer of these (docs/design.md §5.2, §8); the controller
calls it at each event, in its order:

- a group's events (`admitted`, `started`, `finished`, `dropped`, `lost`): the ledger's line
  where the audit needs one (admit, start, drop) and the trace's line;
- when a step's batch is handed to the trainer (`handed_over`): the ledger's `train` line, which is
  what the audit checks, and the time the trace's `train` line is stamped with;
- when it trained (`trained`): the run's totals (`RunStats`: groups and tokens trained, the
  staleness histogram, skipped steps), then — after the policy heard of the step — the trace's
  `train` line (`traced`);
- the engine's timings (`GenerationEngine.timings()`), drained even without a trace so that the
  engine does not hold them for the whole run: before each metrics record (`count`), so that the
  record's totals hold every iteration so far (`RunStats.add_iterations`: speculation's drafted
  and accepted tokens), and at every step end and at the run's end (`engine_work`), which also
  traces what was drained since the last trace;
- `flush_durable`: the ledger and the trace to disk (fsync, docs/fault_tolerance.md), before
  the metrics record, so that a kill between them leaves metrics.jsonl no longer than the
  ledger's steps (the audit compares the two);
- `record`: one flat record per step (metrics.py `step_record`) to every sink — metrics.jsonl,
  TensorBoard, the progress display — with the ETA (`Eta`, the first step's compile left out).

Migrations write their ledger line in runtime/tail.py, where the engine reports them. The
recorder keeps no `RunStats` of its own: the controller replaces its totals on a resume, so each call
takes the totals to update or report.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any

from jaxrl_async.engines.base import EngineTiming
from jaxrl_async.runtime.metrics import EngineLoad, MetricsSink, RunStats, StepTiming, step_record
from jaxrl_async.runtime.progress import Eta
from jaxrl_async.runtime.rollouts import GroupRollout
from jaxrl_async.runtime.tracing import RunTracer
from jaxrl_async.runtime.training import TrainedStep
from jaxrl_async.tasks.base import Prompt
from planner.ledger import LedgerWriter
from planner.types import Admission, Drop


class RunRecorder:
    """`sinks`: the controller's list (a test may append to it); `total_steps`: the run's `steps`;
    `run_meta`: the trace's `run` line (the engine's and the planner's settings, job/report.py)."""

    def __init__(self, ledger: LedgerWriter, tracer: RunTracer, sinks: list[MetricsSink], total_steps: int,
                 run_meta: dict[str, Any]) -> None:
        self.ledger = ledger
        self.tracer = tracer
        self.sinks = sinks
        self.run_meta = run_meta
        self._eta = Eta(total_steps)
        self._untraced: list[EngineTiming] = []  # counted, traced at the next `engine_work`
        self._last = (0.0, 0)  # (run seconds, tokens generated) at the previous record

    def start(self, step: int, tokens_generated: int) -> None:
        """A run segment begins at `step`: its trace's `run` line; the first record's throughput counts from here."""
        self._last = (self.tracer.clock(), tokens_generated)
        self.tracer.event("run", step=step, **self.run_meta)

    def admitted(self, a: Admission, prompt: Prompt, rollout: GroupRollout) -> None:
        self.ledger.admit(a)
        self.tracer.event("admit", uid=a.uid, attempt=rollout.attempt, prompt_id=prompt.prompt_id,
                          prompt_tokens=len(prompt.prompt_ids), version=a.version)

    def started(self, group: GroupRollout, version: int, worker: int) -> None:
        """`group`'s first piece arrived; its first token was sampled by `version` on `worker`."""
        self.ledger.start(group.uid, version)
        self.tracer.event("start", uid=group.uid, attempt=group.attempt, version=version, worker=worker)

    def finished(self, stats: RunStats, group: GroupRollout) -> None:
        """Group `group` generated its last token: traced, and its episodes (multi-turn) counted and traced."""
        self.tracer.event("finish", uid=group.uid, attempt=group.attempt,
                          lengths=[len(s.token_ids) for s in group.samples])
        stats.add_episodes(group.samples)
        for i, s in enumerate(group.samples):
            if s.episode is not None:
                self.tracer.event("episode", uid=group.uid, sample=i, turns=s.episode.turns,
                                  fault=s.episode.fault_kind)

    def dropped(self, stats: RunStats, d: Drop, tokens: int) -> None:
        """Group `d.uid` is dropped with `tokens` generated: wasted."""
        self.ledger.drop(d, tokens)
        self.tracer.event("drop", uid=d.uid)
        stats.groups_dropped += 1
        stats.tokens_wasted += tokens

    def lost(self, group: GroupRollout) -> None:
        self.tracer.event("lost", uid=group.uid, attempt=group.attempt)

    def handed_over(self, step: int, groups: list[GroupRollout]) -> None:
        """Step `step`'s batch goes to the trainer: its ledger line, and the trace's hand-over time."""
        self.ledger.train(step, [(g.uid, g.token_versions(), g.turns() or None) for g in groups])
        self.tracer.handed_over()

    @staticmethod
    def trained(stats: RunStats, groups: list[GroupRollout], step: TrainedStep) -> None:
        """A step trained `groups`: the run's totals."""
        stats.overlap_s += step.timing.overlap_s
        stats.add_batch(step.hist)
        stats.groups_trained += len(groups)
        stats.steps_done += 1
        stats.steps_skipped += int(step.metrics["skipped"])

    def traced(self, step: int, groups: list[GroupRollout], timing: StepTiming) -> None:
        self.tracer.step_trained(step, groups, timing.start_s, timing.train_s)

    def count(self, stats: RunStats, timings: Iterable[EngineTiming]) -> None:
        """The engine's timings since it was last drained, counted into `stats` (traced later)."""
        timings = list(timings)
        stats.add_iterations(timings)
        self._untraced += timings

    def engine_work(self, stats: RunStats, timings: Iterable[EngineTiming], run_s: Callable[[float], float]) -> None:
        """The engine's timings since it was last drained, counted into `stats`; then every one not
        traced yet, in time order (as one drain would give them), traced."""
        self.count(stats, timings)
        timings, self._untraced = sorted(self._untraced, key=lambda e: e.t), []
        self.tracer.engine(timings, run_s)

    def flush_durable(self) -> None:
        """fsync the ledger and the trace (docs/fault_tolerance.md): at step ends and saves."""
        self.ledger.flush(sync=True)
        self.tracer.flush(sync=True)

    def record(self, step: int, stats: RunStats, groups: list[GroupRollout], trained: TrainedStep, *,
               engine: EngineLoad, inflight_groups: int, done_groups: int, extra: dict[str, Any]) -> None:
        """Step `step`'s record to every sink. `stats`: the run's totals now (with its seconds);
        `extra`: keys that ride along once (the latest held-out evaluation)."""
        previous, self._last = self._last, (stats.elapsed_s, stats.tokens_generated)
        eta_s = self._eta.step_done(step + 1, time.monotonic())  # None at the first: it compiled
        record = step_record(
            step, trained.metrics, trained.hist, [len(s.token_ids) for g in groups for s in g.samples], stats,
            trained.timing,
            previous=previous, engine=engine, inflight_groups=inflight_groups, done_groups=done_groups, eta_s=eta_s)
        record.update(extra)
        for sink in self.sinks:
            sink.write(record)
