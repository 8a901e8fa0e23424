"""The run's clock: run seconds, and the busy seconds of the trainer and the engine.

A resumed run is one run in several segments: its time and busy seconds continue from the
checkpoint's totals (`RunStats.elapsed_s`, `trainer_busy_s`, `generator_busy_s`). `start` begins
a segment from those totals; `now` and `run_s` give run seconds (the ledger's, the trace's and
the metrics' time axis), and `totals` the run's stats with this segment's seconds added.

The trainer's busy seconds are the train steps' wall times, counted by the controller
(`trained`); the engine's are its busy fraction (`EngineStats.busy_fraction`) over this segment,
asked of the engine each time, so that a test may swap the engine after construction.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

from jaxrl_async.engines.base import GenerationEngine
from jaxrl_async.runtime.metrics import RunStats


class RunClock:
    """`monotonic`: the time source (seconds); a test passes its own."""

    def __init__(self, monotonic: Callable[[], float] = time.monotonic) -> None:
        self.monotonic = monotonic
        self._t0 = 0.0  # this segment's start (monotonic)
        self._earlier = (0.0, 0.0, 0.0)  # (elapsed, trainer busy, generator busy) seconds of earlier segments
        self._trainer_busy_s = 0.0  # this segment's

    def start(self, stats: RunStats) -> None:
        """A segment begins now, after the earlier ones whose totals `stats` holds."""
        self._t0 = self.monotonic()
        self._earlier = (stats.elapsed_s, stats.trainer_busy_s, stats.generator_busy_s)
        self._trainer_busy_s = 0.0

    def now(self) -> float:
        """Seconds since the run began, earlier segments included."""
        return self.run_s(self.monotonic())

    def run_s(self, t: float) -> float:
        """A monotonic time of this segment (an engine timing's) as run seconds."""
        return self._earlier[0] + (t - self._t0)

    def trained(self, seconds: float) -> None:
        """The trainer was busy `seconds` (one train step)."""
        self._trainer_busy_s += seconds

    async def engine_busy_s(self, engine: GenerationEngine) -> float:
        """Seconds the engine spent generating in this segment (its busy fraction since the start)."""
        return (await engine.stats()).busy_fraction * (self.monotonic() - self._t0)

    async def totals(self, stats: RunStats, engine: GenerationEngine) -> RunStats:
        """A copy of `stats` with the run's elapsed and busy seconds up to now."""
        totals = dataclasses.replace(stats)
        totals.elapsed_s = self.now()
        totals.trainer_busy_s = self._earlier[1] + self._trainer_busy_s
        totals.generator_busy_s = self._earlier[2] + await self.engine_busy_s(engine)
        return totals
