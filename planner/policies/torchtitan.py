"""torchtitan's windowed FIFO scheduler (`torchtitan/experiments/rl/components/work_buffer.py`,
design note `torchtitan/experiments/rl/docs/windowed_fifo.md`, after MiniMax §6.2.4).

Symbols as upstream: P = `num_prompts_per_train_step` (our B), S = `target_offpolicy_steps`,
f = `window_fraction`. The active buffer holds `max_active_rollout_groups` = (S + 1)·P slots; a
slot is charged when a group is admitted and released only after the trainer's weight pull of
the step that trained it, so admitted − P·(versions the generation side holds) ≤ (S + 1)·P —
our `synced` is that pull. The batcher takes the oldest *finished* group inside a window of
W = max(1, ⌊f·(S + 1)·P⌋) admission ids anchored at the oldest group not yet taken; taking a
younger group does not move the anchor, so at most W − 1 groups pass a straggler. Nothing is
ever dropped.

Realized bound (upstream's proof, in our terms): a group admitted on version v has admission id
< (S + 1 + v)·P; at most W − 1 younger groups are taken before it, so it is trained at a step
k with k·P ≤ id + W − 1, i.e. k − v ≤ S + ⌈(W − 1)/P⌉ (upstream's `max_offpolicy_steps`,
(B_cap + W − 2) // P). Strict FIFO (f = null, W = 1) keeps S.

Deliberately different: upstream's batcher takes groups one at a time as they finish and can
hold up to two packed batches ahead of the trainer (a size-1 queue plus one blocked put); here
the batch is chosen when the trainer asks for step k, by the same rule applied B times. Taking
later can only see more finished groups inside the same anchored window; the bound is unchanged.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Any

from planner.base import Group, PolicyBase
from planner.configs import check
from planner.policies.blocks import cumulative_room
from planner.registry import register
from planner.types import Decision, GroupState, PlanContext


@dataclass(frozen=True)
class TorchtitanParams:
    """torchtitan's native parameters (`policy.<name>`).

    Attributes:
        target_offpolicy_steps: S, upstream's staleness target in steps (default 3, upstream's);
            not given: max_staleness.
        window_fraction: f, the batcher's window as a share of the (S + 1)·B active slots
            (upstream's default 0.3); null: strict FIFO (W = 1).
    """

    target_offpolicy_steps: int = 3
    window_fraction: float | None = 0.3

    def __post_init__(self) -> None:
        s = self.target_offpolicy_steps
        check(s >= 0, "policy.target_offpolicy_steps", s, "must be >= 0")
        f = self.window_fraction
        check(f is None or 0 < f <= 1, "policy.window_fraction", f, "must be null (strict FIFO) or in (0, 1]")


@register
class TorchtitanWindowedFifo(PolicyBase):
    """torchtitan windowed FIFO. Mapping from η: `target_offpolicy_steps = η` (S is upstream's
    user-facing staleness target); `window_fraction` keeps upstream's 0.3.

    L1: admitted ≤ (S + 1 + synced)·P (active slots freed at the weight pull). L2: none. L3 at
    step k: B times, take the oldest done group with admission id in [head, head + W − 1], head =
    the oldest untrained group; fewer than B → wait. Strict at S + ⌈(W − 1)/P⌉, which
    `staleness_bound` returns; never drops.
    """

    name = "torchtitan_windowed_fifo"
    strict = True
    Params = TorchtitanParams

    @classmethod
    def default_params(cls, ctx: PlanContext) -> dict[str, Any]:
        return {} if ctx.max_staleness is None else {"target_offpolicy_steps": ctx.max_staleness}

    @property
    def max_active_rollout_groups(self) -> int:
        return (self.params.target_offpolicy_steps + 1) * self.B

    @property
    def window_size(self) -> int:
        f = self.params.window_fraction
        return 1 if f is None else max(1, math.floor(f * self.max_active_rollout_groups))

    def staleness_bound(self) -> int:
        """Upstream's `max_offpolicy_steps` = (B_cap + W − 2) // P = S + ⌈(W − 1)/P⌉."""
        return (self.max_active_rollout_groups + self.window_size - 2) // self.B

    def admission_quota(self, now: float) -> int:
        return cumulative_room(self, lead_groups=self.params.target_offpolicy_steps * self.B, progress=self.synced)

    def choose_batch(self, step: int, now: float) -> Decision:
        untrained = sorted(self.groups.values(), key=lambda g: g.seq)  # admission ids, oldest first
        taken: list[Group] = []
        taken_ids: set[int] = set()
        head = 0  # index into `untrained` of the oldest group not taken
        for _ in range(self.B):
            while head < len(untrained) and untrained[head].uid in taken_ids:
                head += 1
            if head == len(untrained):
                return Decision()  # fewer than B untrained groups
            window_end = untrained[head].seq + self.window_size - 1
            pick = None
            for g in itertools.islice(untrained, head, None):
                if g.seq > window_end:
                    break
                if g.status == GroupState.DONE and g.uid not in taken_ids:
                    pick = g
                    break
            if pick is None:
                return Decision()  # nothing finished inside the anchored window: the trainer waits
            taken.append(pick)
            taken_ids.add(pick.uid)
        return Decision(train=[g.uid for g in taken])
