"""The simulator's timing record for the tail analysis: on a heavy-tailed run each step's
critical group is among its batch's longest, a group's seconds add up to its life, and the record
changes nothing else the run writes."""

import json

import numpy as np

import planner.policies.lookahead  # noqa: F401
from planner.ledger import LedgerWriter
from planner.registry import make_policy
from planner.sim import SimConfig, Simulator, WorkerConfig, make_workload
from planner.ledger_audit import audit
from planner.sim.tail_log import TailLog
from planner.tail_analysis import critical_groups
from planner.types import PlanContext

CTX = PlanContext(batch_groups=8, group_size=4, max_staleness=1, total_steps=20)


def heavy_tail_run(tmp_path, cfg=None):
    run_dir = tmp_path / "run"
    with LedgerWriter(run_dir / "ledger.jsonl") as ledger:
        sim = Simulator(make_policy("lookahead", CTX), CTX, make_workload({"name": "heavy_tail"}, CTX.group_size),
                        cfg or SimConfig(), seed=1, ledger=ledger)
        result = sim.run()
    (run_dir / "summary.json").write_text(json.dumps(result.summary))
    return sim, result, run_dir


def test_each_steps_critical_group_is_among_its_batchs_longest_on_a_heavy_tailed_run(tmp_path):
    sim, result, run_dir = heavy_tail_run(tmp_path)
    assert audit(run_dir, CTX.max_staleness).ok
    groups = sim.tail_log.groups()
    assert len(groups) == CTX.batch_groups * CTX.total_steps
    critical = critical_groups(groups)
    assert len(critical) == CTX.total_steps
    for step, c in critical.items():
        lengths = [g.decode_steps for g in groups if g.step == step]
        assert len(set(lengths)) > 1  # non-trivial: the batch's groups differ in length
        assert c.decode_steps >= np.percentile(lengths, 75), (step, c.decode_steps, sorted(lengths))
    t = result.summary["tail"]
    assert t["steps_bound_by_generation"] > 0.5 and t["wait_share_last_5pct"] > 0.2
    # the straggler decodes long and alone: more seconds, fewer seconds per token than the others
    assert t["mean_s"]["critical"]["decode_s"] > 2 * t["mean_s"]["other"]["decode_s"]
    assert t["decode_s_per_token"]["critical"]["p50"] < t["decode_s_per_token"]["other"]["p50"]


def test_a_simulated_groups_phases_add_up_to_its_run_and_its_decode_is_its_steps_at_their_cost(tmp_path):
    sim, _, _ = heavy_tail_run(tmp_path)
    w = SimConfig().workers
    for g in sim.tail_log.groups():
        run = g.finish_s - g.start_s
        assert abs(g.decode_s + g.load_s + g.prefill_s - run) < 1e-6
        # a decode step costs alpha + beta·active with 1 <= active <= max_concurrency
        assert g.decode_steps * w.decode_alpha * (1 - 1e-9) <= g.decode_s
        assert g.decode_s <= g.decode_steps * (w.decode_alpha + w.decode_beta * w.max_concurrency) * (1 + 1e-9)
        assert g.prefill_s >= 0 and g.load_s >= 0
    assert any(g.load_s > 0 for g in sim.tail_log.groups())  # non-trivial: weight loads interrupt runs


def test_with_a_constant_step_cost_a_simulated_groups_decode_is_exactly_its_steps_at_that_cost(tmp_path):
    """decode_beta = 0: every decode step costs alpha whatever the active count, so any stall
    (its own prefill, others', a weight load) booked as decode shows."""
    cfg = SimConfig(workers=WorkerConfig(decode_beta=0.0, prefill_per_token=1e-3))
    sim, _, _ = heavy_tail_run(tmp_path, cfg)
    groups = sim.tail_log.groups()
    assert all(abs(g.decode_s - g.decode_steps * cfg.workers.decode_alpha) < 1e-6 for g in groups)
    assert all(g.prefill_s > 0 for g in groups)  # non-trivial: every run is stalled by prefill


def test_a_migrated_groups_seconds_are_the_sums_of_its_runs_and_an_unrecorded_move_is_left_out():
    log = TailLog()
    for uid in (1, 2):
        log.admitted(uid, 0.0)
        log.started(uid, 0, 1.0, stalled=0.5, steps=70)
    # uid 1: 1 -> 4 s on worker 0 (0.5 s stalled), then 4 -> 10 s on worker 1 (2 s: transfer + re-prefill)
    log.migrated(1, 4.0, stalled=1.0, worker=1, worker_stalled=10.0)
    log.finished(1, 1, 10.0, stalled=12.0)
    log.finished(2, 1, 10.0, stalled=12.0)  # moved without `migrated`: no trustworthy record
    log.trained(0, [1, 2])
    (g,) = log.groups()
    assert (g.uid, g.worker, g.start_s, g.finish_s, g.decode_steps) == (1, 1, 1.0, 10.0, 70)
    assert (g.decode_s, g.prefill_s, g.load_s) == (2.5 + 4.0, 0.5 + 2.0, 0.0)
