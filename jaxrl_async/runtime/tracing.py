"""The run's timing trace as the controller writes it (`trace.jsonl`, planner/run_trace.py).

What goes in (docs/calibration.md, what `planner.calibrate` fits the simulator to): every
admission, start, finish, loss and drop of a group, every step (batch handed over, optimizer
step, publish, synced), every push (each worker's load) and the engine's iterations, in run
seconds. `RunTracer` is the one writer of these lines; the controller calls it at each event.

The engine keeps its timings (loads, decode iterations) until asked: `engine` drains them at
every step end and at the run's end, even without a trace, so that the engine does not hold
them for the whole run. Iterations that overlap a training step are marked (`during_steps`,
`"train": true`): the colocation term of the fit.

The file is flushed with the ledger (`flush`, fsync'd at step ends and saves:
docs/fault_tolerance.md) and cut back with it on resume (`trace_bytes` in the checkpoint).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from planner.run_trace import TraceWriter, during_steps


class RunTracer:
    """`writer`: the trace file, or None (no trace: events are dropped, timings still drained).
    `clock`: run seconds now (the controller's `now`)."""

    def __init__(self, writer: TraceWriter | None, clock: Callable[[], float]) -> None:
        self.writer = writer
        self.clock = clock
        self._handed_at = 0.0  # run seconds when the batch in training was handed over
        # (handed over, published) run seconds of the steps since the engine's timings were last
        # drained: iterations inside one are traced apart (`"train": true`).
        self._train_windows: list[tuple[float, float]] = []

    @property
    def enabled(self) -> bool:
        return self.writer is not None

    def event(self, kind: str, **fields: Any) -> None:
        """One event line at the current run time."""
        if self.writer is not None:
            self.writer.write(kind, self.clock(), **fields)

    def handed_over(self) -> None:
        """The batch of the next `step_trained` was handed to the trainer now."""
        self._handed_at = self.clock()

    def step_trained(self, step: int, groups: list[Any], start_s: float, train_s: float) -> None:
        """The `train` line of a finished step, at the time its batch was handed over, and the
        step's window (handed over → now) for the engine iterations drained later."""
        if self.writer is not None:
            self.writer.write("train", self._handed_at, step=step, start=round(start_s, 6),
                              end=round(start_s + train_s, 6), groups=len(groups),
                              tokens=sum(len(s.token_ids) for g in groups for s in g.samples),
                              prompt_tokens=sum(len(g.prompt_ids) * len(g.samples) for g in groups))
        self._train_windows.append((self._handed_at, self.clock()))  # the step as the simulator's trainer

    def engine(self, timings: Iterable[Any], run_s: Callable[[float], float]) -> None:
        """The engine's timings since the last call (`GenerationEngine.timings()`): each load,
        and the iterations aggregated. `run_s`: an engine timestamp (monotonic) → run seconds."""
        windows = self._train_windows
        # Later iterations begin after these steps ended; the step that is training now, if any
        # (a run's end), is appended when it publishes.
        self._train_windows = []
        if self.writer is None:
            return
        decode = []
        for e in timings:
            t = run_s(e.t)
            if e.kind == "load":
                self.writer.write("load", t, version=e.version, worker=e.worker, s=round(e.seconds, 6))
            else:
                decode.append((e.worker, e.seconds, e.steps, e.tokens, e.prefill_tokens, e.compiled,
                               during_steps(t, e.seconds, windows), e.drafted, e.accepted))
        self.writer.decode(self.clock(), decode)

    def flush(self, *, sync: bool = False) -> None:
        if self.writer is not None:
            self.writer.flush(sync=sync)
