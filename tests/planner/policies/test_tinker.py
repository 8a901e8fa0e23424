"""tinker-cookbook's paced sampling (pull request 822): pacing by outstanding slots released only
once the new weights are loaded, one rollout worker per batch slot, the deadline wait and
stalest-first batches — strict at `max_steps_off_policy` with nothing discarded."""

from __future__ import annotations

import pytest

from planner.registry import make_policy
from planner.ledger_audit import audit
from planner.tools.simulate import SimulateConfig, run_simulation
from planner.types import PlanContext
from tests.helpers.scripted import ScriptedDriver


def driver(B: int, eta: int, **kw) -> ScriptedDriver:
    ctx = PlanContext(batch_groups=B, group_size=1, max_staleness=eta, total_steps=50)
    return ScriptedDriver(make_policy("tinker_paced", ctx), **kw)


def test_pacing_caps_outstanding_groups_and_frees_a_batch_only_when_the_new_weights_are_loaded():
    d = driver(2, 2, auto_sync=False)  # K = 2, depth = min(1, K) = 1: 4 outstanding, 2 in flight
    assert d.policy.params.resolved_pipeline_depth == 1
    assert len(d.admitted) == 2  # one rollout worker per batch slot
    d.finish_all()
    assert len(d.admitted) == 4
    d.finish_all()
    assert len(d.admitted) == 4  # 4 outstanding (done, untrained): capacity B·(depth+1)
    assert d.train_step() is not None
    assert len(d.admitted) == 4  # trained and published, but not loaded: the slots stay charged
    d.sync()
    assert len(d.admitted) == 6


def test_the_trainer_waits_for_a_rollout_at_its_deadline_and_trains_it_stalest_first():
    d = driver(2, 1)  # K = 1, depth 1: 4 outstanding, 2 in flight
    g0, g1 = d.admitted
    d.finish(g1)
    d.finish(2)
    assert d.admitted == [g0, g1, 2, 3] and d.train_step() == [g1, 2]  # v0 groups, completion order
    d.finish(3)
    d.finish(4)  # admitted on v1
    assert d.train_step() is None  # g0 (v0) is at its deadline 1 − K = 0 and still running: wait
    d.finish(g0)
    assert d.train_step() == [3, g0]  # the v0 groups first; 4 (v1) waits
    assert d.max_staleness == 1 and not d.dropped


@pytest.mark.parametrize("sync_mode", ["partial", "drain"])
def test_a_simulated_run_keeps_max_steps_off_policy_under_audit_and_drops_nothing(tmp_path, sync_mode):
    config = SimulateConfig.from_mapping({
        "policy": {"name": "tinker_paced"}, "max_staleness": 2, "batch_groups": 4, "group_size": 2, "steps": 25,
        "seed": 1, "workload": {"name": "heavy_tail"},
        "sim": {"workers": {"num_workers": 2, "sync_mode": sync_mode, "speeds": [0.3, 1.0]}},
    })
    result = run_simulation(config, tmp_path, plots=False)
    report = audit(tmp_path, config.build_policy().staleness_bound())
    assert not result.deadlock and report.ok, report.verdict()
    assert report.max_token_staleness >= 1  # off-policy groups really were in flight across updates
    assert report.groups_trained == 4 * 25 and set(result.summary["drops_by_reason"]) <= {"end_of_run"}
