"""prime-rl: an adaptive in-flight cap (L1) and one freshness rule at L2 and L3.

Reference "prime-rl": the cap starts at `initial_inflight`, grows multiplicatively while the engines
have no queue and KV usage is under a soft cap (less the fuller KV is), shrinks above the soft cap
so that in-flight work drains, and is clamped to [min_inflight, max_inflight]. `min_fresh_version
(step, max_off_policy_steps) = (step − 1) − max_off_policy_steps` with prime-rl's 1-based step,
i.e. a group trained at our step k needs earliest version ≥ k − max_off_policy_steps. Before a new
version is published, running groups that can no longer pass are cancelled; queued results are
rechecked at every version and again when the batch is assembled.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from planner.base import PolicyBase
from planner.configs import check
from planner.policies.blocks import by_completion, cap_room, drop_all, first_batch, older_than, running_groups
from planner.registry import register
from planner.types import Decision, PlanContext


@dataclass(frozen=True)
class PrimeRlParams:
    """prime-rl's native parameters (`policy.<name>`).

    Attributes:
        max_off_policy_steps: prime-rl's staleness bound in steps; not given: max_staleness.
        max_inflight: ceiling of the adaptive cap, in groups; null: B·(max_off_policy_steps + 1).
        min_inflight: floor of the adaptive cap, in groups; null: B.
        initial_inflight: the cap before the first engine report, in groups; null: B.
        kv_soft_cap: KV usage in (0, 1] above which the cap shrinks.
        max_growth: growth factor of the cap per report at zero KV usage (>= 1).
        backoff: shrink factor of the cap per report above the soft cap, in (0, 1].
    """

    max_off_policy_steps: int = 8
    max_inflight: int | None = None
    min_inflight: int | None = None
    initial_inflight: int | None = None
    kv_soft_cap: float = 0.9
    max_growth: float = 1.25
    backoff: float = 0.75

    def __post_init__(self) -> None:
        check(self.max_off_policy_steps >= 0, "policy.max_off_policy_steps", self.max_off_policy_steps, "must be >= 0")
        for name in ("max_inflight", "min_inflight", "initial_inflight"):
            v = getattr(self, name)
            check(v is None or v >= 1, f"policy.{name}", v, "must be >= 1 or null")
        lo, hi = self.min_inflight, self.max_inflight
        check(lo is None or hi is None or lo <= hi, "policy.min_inflight", lo, f"must be <= max_inflight={hi}")
        check(0 < self.kv_soft_cap <= 1, "policy.kv_soft_cap", self.kv_soft_cap, "must be in (0, 1]")
        check(self.max_growth >= 1, "policy.max_growth", self.max_growth, "must be >= 1")
        check(0 < self.backoff <= 1, "policy.backoff", self.backoff, "must be in (0, 1]")


@register
class PrimeRl(PolicyBase):
    """prime-rl. Mapping from η: `max_off_policy_steps = η`; the cap's ceiling defaults to one batch
    per trainable version, B·(η + 1) (beyond it every extra group is dropped for staleness).

    L1: in flight < cap (see module docstring; `on_engine_stats` drives it, one update per
    report). L2 at `on_version_published(v)`: cancel running groups with earliest version
    < v − max_off_policy_steps, and drop done ones (the queued recheck). L3 at step k: drop done
    groups with earliest version < k − max_off_policy_steps, take B in completion order. Strict.
    Left out: the extra cancellation of work above the cap on preemption (no preemption signal).
    """

    name = "prime_rl"
    strict = True
    Params = PrimeRlParams

    def __init__(self, ctx: PlanContext, params: PrimeRlParams | None = None) -> None:
        super().__init__(ctx, params)
        self.cap = float(self.clamp(self.params.initial_inflight or self.B))

    @classmethod
    def default_params(cls, ctx: PlanContext) -> dict[str, Any]:
        return {} if ctx.max_staleness is None else {"max_off_policy_steps": ctx.max_staleness}

    def clamp(self, cap: float) -> float:
        lo = self.params.min_inflight or self.B
        hi = self.params.max_inflight or self.B * (self.params.max_off_policy_steps + 1)
        return min(max(cap, lo), hi)

    def min_fresh(self, step: int) -> int:
        return step - self.params.max_off_policy_steps

    def admission_quota(self, now: float) -> int:
        return cap_room(int(self.cap), self.inflight)

    def on_engine_stats(self, *, kv_usage: float, queued: int, now: float) -> Decision:
        soft = self.params.kv_soft_cap
        if kv_usage > soft:
            self.cap = self.clamp(self.cap * self.params.backoff)
        elif queued == 0:
            headroom = 1.0 - kv_usage / soft  # growth shrinks as KV fills
            self.cap = self.clamp(self.cap * (1.0 + (self.params.max_growth - 1.0) * headroom))
        return Decision()

    def on_version_published(self, *, version: int, now: float) -> Decision:
        super().on_version_published(version=version, now=now)
        floor = self.min_fresh(version)
        drops = drop_all(self, older_than(running_groups(self), floor), "prime_rl_l2_cancel")
        drops += drop_all(self, older_than(self.done, floor), "prime_rl_l3_stale")
        return Decision(drop=drops)

    def choose_batch(self, step: int, now: float) -> Decision:
        drops = drop_all(self, older_than(self.done, self.min_fresh(step)), "prime_rl_l3_stale")
        return Decision(drop=drops, train=first_batch(by_completion(self.done), self.B))

    def extra_state(self) -> dict[str, Any]:
        return {"cap": self.cap}

    def load_extra_state(self, state: Mapping[str, Any]) -> None:
        self.cap = float(state["cap"])
