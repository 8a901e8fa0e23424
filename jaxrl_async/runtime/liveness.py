"""Stall detection: which generating groups made no token progress for `rollout.stall_timeout_s`.

A strict, no-drop scheduler waits for every group of a batch, so one rollout that never finishes
would hold its batch forever (docs/design.md §5.4). The controller feeds a `StallWatch` every
submission and every streamed piece, and asks it every `period_s` which groups stalled; each
stalled group goes through the planner's fault path (`on_group_lost(prefix_kept=False)`: start
barrier, new deadline, new request id). The watch only reads the pieces the engine streams, so it
works unchanged for every engine (jax, vllm, the Ray proxy).

The rules, and why:

- A group's clock starts when its request is sent to the engine (a group held at its start
  barrier is waiting for weights, not for the engine) and restarts at each of its pieces.
- A group that has not streamed its first piece may just be queued behind others (the engine has
  more requests than slots): that is not a stall while the engine streams pieces of other groups,
  so its clock is also restarted by every piece the engine streams.
- Start-up (model load, the first compilation) is not a stall: the watch arms at the engine's
  first piece of the run segment.
- A stall round in which the engine streamed nothing for a whole timeout is *quiet*;
  `max_quiet_stalls` quiet rounds in a row (no piece in between) mean the engine itself hangs,
  and regenerating on it again would only wedge: `EngineHungError`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from jaxrl_async.runtime.config import RolloutConfig


class EngineHungError(ConnectionError):
    """The engine streamed no token through `max_quiet_stalls` stall rounds: the run lost its
    engine, like an unreachable cluster (a ConnectionError, so the entry point prints one line)."""


@dataclass(frozen=True)
class Stall:
    uid: int
    request_id: str
    idle_s: float  # seconds without a piece of this attempt (or of the engine, for a queued one)


@dataclass(frozen=True)
class StallRound:
    stalls: list[Stall]
    quiet: bool  # the engine streamed nothing at all for a whole timeout
    quiet_rounds: int  # quiet rounds in a row, this one included


class StallWatch:
    """Progress times per request id and for the engine as a whole (controller clock seconds)."""

    def __init__(self, cfg: RolloutConfig) -> None:
        self.timeout_s = cfg.stall_timeout_s
        self.max_quiet_stalls = cfg.max_quiet_stalls
        self._last: dict[str, float] = {}  # request id -> its submission or its latest piece
        self._engine_last: float | None = None  # the engine's latest piece; None before the first
        self.quiet_rounds = 0

    @property
    def enabled(self) -> bool:
        return self.timeout_s is not None

    @property
    def period_s(self) -> float:
        """How often the controller asks: a quarter of the timeout (a stall is seen within 1.25
        timeouts), at most every 10 s."""
        return min(self.timeout_s / 4, 10.0)

    def submitted(self, request_id: str, now: float) -> None:
        self._last[request_id] = now

    def piece(self, request_id: str | None, now: float) -> None:
        """The engine streamed a piece (of `request_id`; None: of a request no group waits for,
        which still proves the engine alive)."""
        self._engine_last = now
        self.quiet_rounds = 0
        if request_id is not None and request_id in self._last:
            self._last[request_id] = now

    def check(self, now: float, generating: Iterable[tuple[int, str, bool]]) -> StallRound | None:
        """`generating`: (uid, current request id, has streamed a piece) of every group whose
        current attempt generates. Returns the stalled ones, or None when none stalled. Requests
        not listed are forgotten (trained, dropped, superseded)."""
        if not self.enabled or self._engine_last is None:
            return None
        live, stalls = {}, []
        for uid, request_id, started in generating:
            since = self._last.get(request_id)
            if since is None:
                continue  # not sent yet: held at its start barrier
            live[request_id] = since
            if not started:
                since = max(since, self._engine_last)
            if now - since >= self.timeout_s:
                stalls.append(Stall(uid, request_id, now - since))
        self._last = live
        if not stalls:
            return None
        quiet = now - self._engine_last >= self.timeout_s
        self.quiet_rounds = self.quiet_rounds + 1 if quiet else 0
        for s in stalls:
            self._last.pop(s.request_id, None)
        return StallRound(stalls, quiet, self.quiet_rounds)

    @property
    def hung(self) -> bool:
        return self.quiet_rounds >= self.max_quiet_stalls

    def hung_error(self, now: float, waiting: int) -> EngineHungError:
        idle = now - (self._engine_last or 0.0)
        return EngineHungError(
            f"rollout: the engine streamed no token for {idle:.0f} s through {self.quiet_rounds} stall rounds "
            f"(rollout.stall_timeout_s={self.timeout_s:g}, {waiting} groups waiting): it hangs; restart it and "
            "resume from the newest checkpoint (resume=true)")
