"""The tail terms of `planner.calibrate`: speculative decoding and straggler migration, fitted from
a trace that holds them (docs/calibration.md), so that a run without them calibrates as before.

    speculation(decode_lines, head, coef, speed)  -> {when, acceptance, tokens, draft_cost, max_active} | None
    migration(migrate_lines, prefill, speed)      -> {migration_s, moves} | None

Speculation (`decode` lines with `drafted` > 0, planner/run_trace.py), in the simulator's
terms (`sim.workers.speculation.*`, planner/sim/config.py):

- acceptance a: the simulator keeps each drafted token with probability a until the first
  rejection, so a k-token draft keeps Σ_{i=1..k} aⁱ tokens on average; the trace measures the
  share kept, r = Σ accepted / Σ drafted, and a is the root of a(1 − aᵏ)/((1 − a)·k) = r
  (increasing in a: bisection). k is the run line's `speculation.tokens`.
- draft_cost c: a speculating step costs α·(1 + c·k) + β·active in the simulator. Given the
  α, β, p and worker speeds fitted to the plain iterations, the speculating lines' time beyond
  β·active·steps + p·prefill is α·steps·(1 + c·k): c by least squares over those lines, ≥ 0.
  (`active`·steps is tokens − accepted: each verification emits one token beside the accepted drafts.)
- when, tokens, max_active: the run line's `speculation` (the engine's `engine.speculation.*`).

Migration (`migrate` lines): each move's seconds `s` minus the target's re-prefill of its
`prefill_tokens` at the fitted p (the simulator adds that prefill itself): the median is
`sim.workers.migration_s`.

Each returns None when the trace holds nothing to fit, and the caller emits no key.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np


def acceptance_from_kept(kept: float, k: int) -> float:
    """The per-token acceptance a whose expected kept share of a k-token draft is `kept`."""
    if kept <= 0:
        return 0.0
    if kept >= 1:
        return 1.0
    lo, hi = 0.0, 1.0
    for _ in range(60):
        a = (lo + hi) / 2
        share = sum(a ** i for i in range(1, k + 1)) / k
        lo, hi = (a, hi) if share < kept else (lo, a)
    return (lo + hi) / 2


def speculation(lines: Sequence[Mapping[str, Any]], head: Mapping[str, Any], coef: np.ndarray,
                speed: np.ndarray) -> dict[str, Any] | None:
    """The speculation terms from the timed (not compiling) `decode` lines; None without a drafted
    token. Without the run line's `speculation.tokens` only the kept share is known: `acceptance`
    and `draft_cost` are then None (the caller warns)."""
    spec = [e for e in lines if e.get("drafted")]
    if not spec:
        return None
    drafted = sum(e["drafted"] for e in spec)
    accepted = sum(e["accepted"] for e in spec)
    conf = head.get("speculation") or {}
    k = conf.get("tokens")
    out: dict[str, Any] = {"when": conf.get("when", "always"), "kept_share": accepted / drafted, "tokens": k,
                           "acceptance": None, "draft_cost": None,
                           "max_active": conf.get("max_active", max(e["active"] for e in spec)), "lines": len(spec)}
    if not k:
        return out
    alpha, beta, prefill = coef
    out["acceptance"] = acceptance_from_kept(accepted / drafted, int(k))
    w = speed[np.array([e["worker"] for e in spec])]
    base = np.array([alpha * e["steps"] for e in spec])  # α·steps: what c·k multiplies
    rest = np.array([e["s"] * ws - beta * (e["tokens"] - e["accepted"]) - prefill * e["prefill_tokens"]
                     for e, ws in zip(spec, w)])
    if float(base @ base) > 0:
        out["draft_cost"] = max(0.0, (float(base @ rest) / float(base @ base) - 1.0) / int(k))
    return out


def migration(lines: Sequence[Mapping[str, Any]], prefill: float, speed: np.ndarray) -> dict[str, Any] | None:
    """`migration_s` from the `migrate` lines; None without one."""
    if not lines:
        return None
    costs = [max(0.0, e["s"] - prefill * e.get("prefill_tokens", 0) / speed[e["to"]]) for e in lines]
    return {"migration_s": float(np.median(costs)), "moves": len(lines)}
