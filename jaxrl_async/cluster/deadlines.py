"""`RpcDeadlines`: how long a Ray generation worker may take to answer a call, per call kind.

A worker is declared lost when one of its own calls misses its deadline; the other workers'
calls are never waited for together with it (cluster/ray/proxy.py). The deadline follows what the run
observes: per kind (`poll`, `submit`, `abort`, `mark_critical`, `update_weights`, `stop`) the latest
`window` answer times, and

    timeout = clamp(factor x p99(observed), floor_s, ceiling_s)

so a fast cluster finds a stopped worker in about `floor_s` (10 s), while a slow weight push
(a large model through the object store) that the run has seen take 30 s gets up to `ceiling_s`.
A kind with no answer yet gets `ceiling_s`: the first push of a big model may be slow, and a
wrong early verdict kills a healthy worker. `override_s` (`cluster.rpc_timeout_s`) replaces the
rule with one fixed deadline for every kind, as before.

`late_s(kind)`: a softer bound, `clamp(3 x p99, late_floor_s, timeout)`, after which a worker
is only *suspect*: the proxy routes new requests to the other workers while there are any, but
does not kill it (a stall that ends before `timeout` costs nothing).

Pure Python and clock-free: callers pass the seconds they measured, so tests drive it directly.
"""

from __future__ import annotations

from collections import deque

from planner.configs import check

KINDS = ("poll", "submit", "abort", "mark_critical", "update_weights", "stop")


class RpcDeadlines:
    """Per-kind deadlines from observed latencies (see the module docstring)."""

    def __init__(self, *, floor_s: float = 10.0, ceiling_s: float = 120.0, override_s: float | None = None,
                 factor: float = 20.0, window: int = 256, late_floor_s: float = 1.0):
        check(0 < floor_s <= ceiling_s, "cluster.rpc_timeout_floor_s", floor_s,
              f"must be > 0 and <= cluster.rpc_timeout_ceiling_s={ceiling_s}")
        self.floor_s, self.ceiling_s, self.override_s = floor_s, ceiling_s, override_s
        self.factor, self.late_floor_s = factor, late_floor_s
        self._seen: dict[str, deque[float]] = {kind: deque(maxlen=window) for kind in KINDS}

    def observe(self, kind: str, seconds: float) -> None:
        """A call of `kind` answered after `seconds`."""
        self._seen[kind].append(max(0.0, seconds))

    def p99(self, kind: str) -> float | None:
        """The 99th percentile of the kind's recent answer times (None before the first)."""
        seen = sorted(self._seen[kind])
        if not seen:
            return None
        return seen[min(len(seen) - 1, int(0.99 * len(seen)))]

    def timeout_s(self, kind: str) -> float:
        """The deadline of one call of `kind`: past it, the worker is lost."""
        if self.override_s is not None:
            return self.override_s
        p99 = self.p99(kind)
        if p99 is None:
            return self.ceiling_s
        return min(self.ceiling_s, max(self.floor_s, self.factor * p99))

    def late_s(self, kind: str) -> float:
        """Past this, a worker's unanswered call makes it suspect (no new work), not lost."""
        p99 = self.p99(kind)
        return min(self.timeout_s(kind), max(self.late_floor_s, 3 * (p99 or 0.0)))
