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

`watch_stalls` is the controller's watchdog task: every `period_s` it asks the watch, under the
controller's lock, and sends each stalled group through the fault path with one warning line
(counted as `groups_stalled`). On a hung engine it saves a checkpoint (when no step is training)
and ends the run with the one-line `EngineHungError`. It reaches the controller only through
`StallHost`, so a test can drive it with a fake.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

from jaxrl_async.runtime.config import RolloutConfig

log = logging.getLogger(__name__)


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


class StallHost(Protocol):
    """What `watch_stalls` needs of the controller."""

    lock: asyncio.Lock

    def now(self) -> float: ...
    def ended(self) -> bool: ...  # stopping or done: the watchdog ends
    def generating(self) -> list[tuple[int, str, bool]]: ...  # (uid, request id, started), not lost
    def groups_in_flight(self) -> int: ...
    async def save_if_idle(self) -> None: ...  # a checkpoint, unless a step is training
    def regenerate_stalled(self, uid: int) -> None: ...  # count it, the fault path
    async def after_event(self) -> None: ...  # send the engine calls, admit and select again


async def watch_stalls(watch: StallWatch, host: StallHost) -> None:
    """Every `watch.period_s`: regenerate the groups that stalled; raise `EngineHungError` on a hung engine."""
    while True:
        await asyncio.sleep(watch.period_s)
        async with host.lock:
            if host.ended():
                return
            now = host.now()
            stall_round = watch.check(now, host.generating())
            if stall_round is None:
                continue
            if watch.hung:
                await host.save_if_idle()
                raise watch.hung_error(now, host.groups_in_flight())
            for stall in stall_round.stalls:
                log.warning("rollout stalled: group %d (request %s) streamed no token for %.1f s%s; "
                            "regenerating it through the fault path", stall.uid, stall.request_id,
                            stall.idle_s, " (the engine streamed nothing either)" if stall_round.quiet else "")
                host.regenerate_stalled(stall.uid)
            await host.after_event()
