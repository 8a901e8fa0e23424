"""The trainer's side of a step as the controller runs it: the optimizer step, in a thread of its
own, timed, with the generation it overlapped; then the publication of its weights to the engine.

`Trainer.step` runs in a single-thread executor of its own (docs/design.md §5.2): slow user reward
functions fill the default pool, and a step must never wait behind them. Around it `StepRunner`
measures what the step's record reports — its seconds (the trainer's busy time, `RunClock.trained`),
the engine's busy seconds meanwhile (the overlap: the asynchrony, measured) — and the batch's
tokens by staleness. `publish` sends the trainer's weights to the engine and times it: from the
trainer's layout to every engine replica holding them (cast, reshard or gather, install). Neither
calls a policy or writes a file: the controller does both, in order, with what they return.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from jaxrl_async.engines.base import GenerationEngine
from jaxrl_async.runtime.batching import batch_staleness, make_train_batch
from jaxrl_async.runtime.clock import RunClock
from jaxrl_async.runtime.metrics import StepTiming
from jaxrl_async.runtime.rollouts import GroupRollout
from jaxrl_async.trainer.trainer import Trainer


@dataclass(frozen=True)
class TrainedStep:
    metrics: dict[str, float]  # the trainer's (loss, reward_mean, skipped, ...)
    hist: dict[int, int]  # the batch's trained tokens by staleness
    timing: StepTiming


class StepRunner:
    """`engine_dtype`: the engine's weights' dtype; `engine_busy_s()`: the engine's busy seconds in
    this segment (`RunClock.engine_busy_s` of the controller's current engine); `now()`: run seconds."""

    def __init__(self, trainer: Trainer, engine_dtype: str, clock: RunClock,
                 engine_busy_s: Callable[[], Awaitable[float]], now: Callable[[], float]) -> None:
        self.trainer = trainer
        self.engine_dtype = engine_dtype
        self.clock = clock
        self.engine_busy_s = engine_busy_s
        self.now = now
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="train-step")
        self._idle_since = 0.0  # run seconds when the trainer last became idle

    def idle(self) -> None:
        """The trainer is idle from now on (a segment's start, a step's end): it waits for a batch."""
        self._idle_since = self.now()

    async def train(self, step: int, groups: list[GroupRollout]) -> TrainedStep:
        """Train step `step` on `groups` (the wait since `idle` is the step's `wait_s`)."""
        wait_s = self.now() - self._idle_since
        batch = make_train_batch(groups, rows_multiple=self.trainer.rows_multiple)
        gen0, t0, start_s = await self.engine_busy_s(), time.monotonic(), self.now()
        metrics = await asyncio.get_running_loop().run_in_executor(self._thread, self.trainer.step, batch)
        train_s = time.monotonic() - t0
        overlap_s = await self.engine_busy_s() - gen0  # generation while the trainer trained
        self.clock.trained(train_s)
        return TrainedStep(metrics, batch_staleness(step, groups),
                           StepTiming(wait_s, train_s, overlap_s, start_s, start_s + train_s))

    async def publish(self, engine: GenerationEngine, version: int) -> float:
        """Give `engine` the trainer's weights as `version`; returns, once it holds them, the seconds
        it took."""
        t0 = time.monotonic()
        await engine.update_weights(self.trainer.engine_params(self.engine_dtype), version)
        return time.monotonic() - t0

    def close(self) -> None:
        """Wait for a step still running (a run that ends on an error) and end the thread."""
        self._thread.shutdown(wait=True)
