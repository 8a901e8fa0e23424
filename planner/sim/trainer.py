"""The simulated trainer: one optimizer step at a time, `c0 + c1 · tokens_in_batch` seconds
(the first step `compile_s` more: a real trainer compiles its update then).

It is idle (asking the policy for batch `step`), waiting (the policy said wait: it asks again after
every completion or drop) or busy (training). After a step it publishes version `step + 1`.
"""

from __future__ import annotations

from planner.sim.config import SimTrainerConfig


class SimTrainer:
    def __init__(self, cfg: SimTrainerConfig, total_steps: int) -> None:
        self.c0 = cfg.c0
        self.c1 = cfg.c1
        self.compile_s = cfg.compile_s
        self.total_steps = total_steps
        self.step = 0  # the step being trained or waited for
        self.busy = False
        self.wait_since = 0.0  # when the trainer last became idle
        self.busy_total = 0.0
        self.wait_total = 0.0
        self.finished = False

    @property
    def waiting(self) -> bool:
        return not (self.busy or self.finished)

    def begin(self, now: float, tokens: int) -> float:
        """Start training step `step`; returns when it ends."""
        duration = self.c0 + self.c1 * tokens
        if self.step == 0 and self.compile_s:  # at 0 the sum is not even touched: runs stay identical
            duration += self.compile_s
        self.wait_total += now - self.wait_since
        self.busy = True
        self.busy_total += duration
        return now + duration

    def end(self, now: float) -> int:
        """Step done; returns the version it publishes."""
        self.busy = False
        self.wait_since = now
        self.step += 1
        self.finished = self.step >= self.total_steps
        return self.step
