"""A policy driven by the simulator decides exactly what a fresh copy decides on the same events."""

import pytest

import planner.policies  # noqa: F401
import planner.policies.lookahead  # noqa: F401
from planner.registry import make_policy
from planner.sim import EventRecorder, FaultConfig, SimConfig, Simulator, first_divergence, make_workload, replay
from planner.types import PlanContext


def record(name, ctx, workload="bimodal"):
    recorder = EventRecorder()
    cfg = SimConfig(faults=FaultConfig(events=({"time": 60.0, "worker": 1},), recovery="regenerate", restart_after=10.0))
    Simulator(make_policy(name, ctx), ctx, make_workload({"name": workload}, ctx.group_size), cfg, seed=1,
              recorder=recorder).run()
    return recorder


@pytest.mark.parametrize("workload", ["bimodal", "multi_turn"])
@pytest.mark.parametrize("name", ["lookahead", "prime_rl", "nemo_in_order", "dressage"])
def test_replaying_the_recorded_events_reproduces_every_decision(tmp_path, name, workload):
    ctx = PlanContext(4, 4, 2, 12)
    recorder = record(name, ctx, workload)
    methods = {c.method for c in recorder.calls}
    assert {"admit", "select_batch", "on_group_finished", "on_version_synced", "on_group_lost", "finish"} <= methods
    assert first_divergence(recorder.calls, make_policy(name, ctx)) is None
    recorder.dump(tmp_path / "events.jsonl")  # the runtime's parity test reads this format
    assert first_divergence(EventRecorder.load(tmp_path / "events.jsonl"), make_policy(name, ctx)) is None


def test_a_differently_configured_policy_diverges_from_the_recording():
    recorder = record("nemo_in_order", PlanContext(4, 4, 2, 12))
    assert first_divergence(recorder.calls, make_policy("nemo_in_order", PlanContext(4, 4, 1, 12))) is not None
    assert len(replay(recorder.calls[:5], make_policy("nemo_in_order", PlanContext(4, 4, 2, 12)))) == 5
