"""The run's clock (runtime/clock.py): run seconds and busy seconds continue across segments."""

import asyncio

from jaxrl_async.runtime.clock import RunClock
from jaxrl_async.runtime.metrics import RunStats


class FakeTime:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


class BusyEngine:
    """An engine busy `fraction` of the time since its start."""

    def __init__(self, fraction: float) -> None:
        self.fraction = fraction

    async def stats(self):
        return type("Stats", (), {"busy_fraction": self.fraction})()


def test_run_seconds_continue_from_the_earlier_segments_time():
    time = FakeTime(1000.0)
    clock = RunClock(time)
    clock.start(RunStats(elapsed_s=30.0))
    time.t = 1004.5
    assert clock.now() == 34.5
    assert clock.run_s(1002.0) == 32.0  # an engine timing of this segment, as run seconds


def test_totals_add_this_segments_busy_seconds_to_the_earlier_ones_and_leave_the_stats_alone():
    time = FakeTime(50.0)
    clock = RunClock(time)
    earlier = RunStats(elapsed_s=10.0, trainer_busy_s=4.0, generator_busy_s=6.0, steps_done=3)
    clock.start(earlier)
    time.t = 60.0
    clock.trained(2.0)
    clock.trained(1.5)
    engine = BusyEngine(0.25)
    assert asyncio.run(clock.engine_busy_s(engine)) == 2.5
    totals = asyncio.run(clock.totals(earlier, engine))
    assert (totals.elapsed_s, totals.trainer_busy_s, totals.generator_busy_s, totals.steps_done) == (20.0, 7.5, 8.5, 3)
    assert (earlier.elapsed_s, earlier.trainer_busy_s, earlier.generator_busy_s) == (10.0, 4.0, 6.0)


def test_the_run_seconds_do_not_count_the_segment_twice_once_the_totals_are_taken():
    time = FakeTime(0.0)
    clock = RunClock(time)
    clock.start(RunStats())
    time.t = 8.0
    final = asyncio.run(clock.totals(RunStats(), BusyEngine(0.0)))  # the controller's stats at the run's end
    assert final.elapsed_s == 8.0 and clock.now() == 8.0 and clock.run_s(7.0) == 7.0
