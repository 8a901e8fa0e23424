"""slime fully async: two separate prompt thresholds (L1 only), FIFO sampling.

Reference "slime": `P = Σ sglang_server_concurrency / n_samples_per_prompt ·
fully_async_group_prefetch_factor`; a new prompt starts only while running prompts < P *and*
completed-but-untaken prompts < P (each checked on its own, not their sum). The trainer takes
`rollout_batch_size` prompts from the completion queue, the rest wait for the next batch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from planner.base import PolicyBase
from planner.configs import check
from planner.policies.blocks import by_completion, cap_room, first_batch
from planner.registry import register
from planner.types import Decision, PlanContext


@dataclass(frozen=True)
class SlimeParams:
    """slime's native parameters (`policy.<name>`).

    Attributes:
        sglang_server_concurrency: trajectories generating at once, summed over engines; null: n·B.
        fully_async_group_prefetch_factor: slime's in-flight cap, in multiples of B groups; not
            given: max_staleness + 1.
    """

    sglang_server_concurrency: int | None = None
    fully_async_group_prefetch_factor: float = 1.0

    def __post_init__(self) -> None:
        c = self.sglang_server_concurrency
        check(c is None or c >= 1, "policy.sglang_server_concurrency", c, "must be >= 1 or null")
        f = self.fully_async_group_prefetch_factor
        check(f > 0, "policy.fully_async_group_prefetch_factor", f, "must be > 0")


@register
class Slime(PolicyBase):
    """slime. Mapping from η: `fully_async_group_prefetch_factor = η + 1` with
    `sglang_server_concurrency = n·B` (one batch of trajectories), so P = (η + 1)·B prompts.

    L1: admit while running < P and done-untaken < P. L2: none. L3: completion (FIFO) order, B
    at a time. Not strict: a slow prompt keeps one running slot for as long as it likes.
    """

    name = "slime"
    strict = False
    Params = SlimeParams

    def __init__(self, ctx: PlanContext, params: SlimeParams | None = None) -> None:
        super().__init__(ctx, params)
        check(self.threshold() >= 1, "policy.sglang_server_concurrency", self.params.sglang_server_concurrency,
              f"gives a prompt threshold below 1 with group_size={ctx.group_size} and prefetch "
              f"{self.params.fully_async_group_prefetch_factor}")

    @classmethod
    def default_params(cls, ctx: PlanContext) -> dict[str, Any]:
        eta = ctx.max_staleness
        return {} if eta is None else {"fully_async_group_prefetch_factor": float(eta + 1)}

    def threshold(self) -> int:
        n = self.ctx.group_size
        concurrency = self.params.sglang_server_concurrency or n * self.B
        return int(concurrency / n * self.params.fully_async_group_prefetch_factor)

    def admission_quota(self, now: float) -> int:
        p = self.threshold()
        if self.num_done >= p:
            return 0
        return cap_room(p, self.inflight)

    def choose_batch(self, step: int, now: float) -> Decision:
        return Decision(train=first_batch(by_completion(self.done), self.B))
