"""StallWatch: which generating groups stalled, and when the engine itself hangs; the watchdog task
that acts on it (runtime/liveness.py)."""

import asyncio
import logging

import pytest

from jaxrl_async.runtime.config import RolloutConfig
from jaxrl_async.runtime.liveness import EngineHungError, StallWatch, watch_stalls
from planner.configs import build


def watch(timeout=10.0, quiet=3) -> StallWatch:
    return StallWatch(RolloutConfig(stall_timeout_s=timeout, max_quiet_stalls=quiet))


def stalled(round_) -> list[tuple[int, str]]:
    return [] if round_ is None else [(s.uid, s.request_id) for s in round_.stalls]


def test_a_started_group_stalls_after_the_timeout_without_its_own_pieces_even_while_others_stream():
    w = watch()
    w.submitted("1.0", 0.0)
    w.submitted("2.0", 0.0)
    w.piece("1.0", 1.0)
    w.piece("2.0", 1.0)
    for t in range(2, 12):
        w.piece("2.0", float(t))  # only group 2 goes on streaming
    assert stalled(w.check(10.9, [(1, "1.0", True), (2, "2.0", True)])) == []
    r = w.check(11.0, [(1, "1.0", True), (2, "2.0", True)])
    assert stalled(r) == [(1, "1.0")] and r.stalls[0].idle_s == pytest.approx(10.0)
    assert not r.quiet and r.quiet_rounds == 0


def test_a_queued_group_is_not_stalled_while_the_engine_streams_other_groups():
    w = watch()
    w.submitted("1.0", 0.0)
    w.submitted("2.0", 0.0)
    for t in range(1, 30):
        w.piece("2.0", float(t))
    assert stalled(w.check(30.0, [(1, "1.0", False), (2, "2.0", True)])) == []
    # The engine goes quiet: now the queued group has waited a whole timeout on an idle engine.
    r = w.check(39.0, [(1, "1.0", False)])
    assert stalled(r) == [(1, "1.0")] and r.quiet and r.quiet_rounds == 1


def test_a_group_held_at_its_start_barrier_never_stalls():
    w = watch()
    w.submitted("2.0", 0.0)
    w.piece("2.0", 1.0)
    assert stalled(w.check(100.0, [(1, "1.0", False)])) == []  # 1.0 was never sent to the engine


def test_start_up_is_not_a_stall_the_watch_arms_at_the_engines_first_piece():
    w = watch()
    w.submitted("1.0", 0.0)
    assert w.check(1000.0, [(1, "1.0", False)]) is None  # compiling
    w.piece("1.0", 1000.0)
    assert w.check(1009.0, [(1, "1.0", True)]) is None
    assert stalled(w.check(1010.0, [(1, "1.0", True)])) == [(1, "1.0")]


def test_quiet_stall_rounds_in_a_row_mean_a_hung_engine_and_any_piece_resets_the_count():
    w = watch(quiet=2)
    w.submitted("1.0", 0.0)
    w.piece("1.0", 0.0)
    assert w.check(10.0, [(1, "1.0", True)]).quiet_rounds == 1 and not w.hung
    w.submitted("1.1", 10.0)
    w.piece(None, 12.0)  # a late piece of an aborted attempt: the engine is alive
    assert w.quiet_rounds == 0
    assert w.check(21.0, [(1, "1.1", False)]) is None  # queued: the engine streamed 9 s ago
    r = w.check(22.0, [(1, "1.1", False)])
    assert stalled(r) == [(1, "1.1")] and r.quiet_rounds == 1 and not w.hung  # counted afresh after the piece
    w.submitted("1.2", 22.0)
    assert w.check(32.0, [(1, "1.2", False)]).quiet_rounds == 2 and w.hung
    error = w.hung_error(32.0, waiting=3)
    assert isinstance(error, EngineHungError) and isinstance(error, ConnectionError)
    assert "streamed no token for 20 s through 2 stall rounds" in str(error) and "\n" not in str(error)


def test_a_null_timeout_turns_the_watch_off():
    w = watch(timeout=None)
    w.submitted("1.0", 0.0)
    w.piece("1.0", 0.0)
    assert not w.enabled and w.check(1e9, [(1, "1.0", True)]) is None


@pytest.mark.parametrize("values, message", [
    ({"stall_timeout_s": 0}, r"rollout.stall_timeout_s=0: must be a number > 0"),
    ({"stall_timeout_s": "5"}, r"rollout.stall_timeout_s='5'"),
    ({"max_quiet_stalls": 0}, r"rollout.max_quiet_stalls=0: must be an int >= 1"),
    ({"stall_s": 1}, r"rollout.stall_s: unknown key"),
])
def test_a_bad_rollout_setting_is_a_one_line_error_naming_the_key(values, message):
    with pytest.raises(ValueError, match=message) as info:
        build(RolloutConfig, values, "rollout")
    assert "\n" not in str(info.value)


class FakeHost:
    """`StallHost` with a clock the test sets: records what the watchdog asks of the controller."""

    def __init__(self, generating: list[tuple[int, str, bool]], now: float) -> None:
        self.lock = asyncio.Lock()
        self._generating, self._now = generating, now
        self.regenerated: list[int] = []
        self.saves = self.reactions = 0
        self.stop = False

    def now(self) -> float:
        return self._now

    def ended(self) -> bool:
        return self.stop

    def generating(self) -> list[tuple[int, str, bool]]:
        return self._generating

    def groups_in_flight(self) -> int:
        return len(self._generating)

    async def save_if_idle(self) -> None:
        self.saves += 1

    def regenerate_stalled(self, uid: int) -> None:
        self.regenerated.append(uid)

    async def after_event(self) -> None:
        self.reactions += 1
        self.stop = True  # one round is enough: the watchdog ends at its next wake-up


def test_the_watchdog_sends_each_stalled_group_through_the_fault_path_once_then_reacts(caplog):
    w = watch(timeout=0.04, quiet=3)
    for rid in ("1.0", "2.0"):
        w.submitted(rid, 0.0)
    w.piece("2.0", 0.0)
    w.piece("2.0", 1.0)  # group 2 streams; group 1 never did, and the engine went quiet after t=1
    host = FakeHost([(1, "1.0", True), (2, "2.0", True)], now=1.03)
    w.piece("2.0", 1.03)
    with caplog.at_level(logging.WARNING, logger="jaxrl_async.runtime.liveness"):
        asyncio.run(asyncio.wait_for(watch_stalls(w, host), 5))
    assert host.regenerated == [1] and host.reactions == 1 and host.saves == 0
    assert any("group 1 (request 1.0) streamed no token for 1.0 s" in r.getMessage() for r in caplog.records)


def test_the_watchdog_saves_and_ends_the_run_with_a_one_line_error_when_the_engine_hangs():
    w = watch(timeout=0.04, quiet=1)
    w.submitted("1.0", 0.0)
    w.piece(None, 0.0)  # armed; then nothing at all for 5 s
    host = FakeHost([(1, "1.0", False)], now=5.0)
    with pytest.raises(EngineHungError, match=r"streamed no token for 5 s through 1 stall rounds.*1 groups waiting"):
        asyncio.run(asyncio.wait_for(watch_stalls(w, host), 5))
    assert host.saves == 1 and host.regenerated == []  # a hung engine is not asked to regenerate


def test_the_watchdog_ends_quietly_once_the_run_is_stopping():
    host = FakeHost([(1, "1.0", True)], now=100.0)
    host.stop = True
    w = watch(timeout=0.04)
    w.submitted("1.0", 0.0)
    w.piece(None, 0.0)
    asyncio.run(asyncio.wait_for(watch_stalls(w, host), 5))
    assert host.regenerated == [] and host.reactions == 0
