"""Tiny policies for the simulator tests (the real baselines live in planner/policies)."""

from __future__ import annotations

from planner.base import PolicyBase
from planner.types import Decision


class FifoCapped(PolicyBase):
    """Admit while fewer than `cap` groups are untrained; train the B oldest done groups. No bound."""

    name = "test_fifo"

    def __init__(self, ctx, params=None, cap: int | None = None) -> None:
        super().__init__(ctx, params)
        self.cap = cap if cap is not None else 3 * ctx.batch_groups

    def admission_quota(self, now: float) -> int:
        return min(self.cap - self.untrained, self.B * self.ctx.total_steps - self.admitted_total)

    def choose_batch(self, step: int, now: float) -> Decision:
        if self.num_done < self.B:
            return Decision()
        return Decision(train=self.take_oldest_first(self._done.values(), self.B))


class NeverTrains(FifoCapped):
    """A broken policy: admits, never selects a batch — the simulator must report a deadlock."""

    name = "test_never"

    def choose_batch(self, step: int, now: float) -> Decision:
        return Decision()
