"""The simulator as a driver: determinism, conservation, version tagging, faults, deadlock, speed."""

import json
import time

import pytest

import planner.policies  # noqa: F401  (registers the baselines)
import planner.policies.lookahead  # noqa: F401
from planner.configs import build
from planner.ledger import LedgerWriter, read_ledger
from planner.registry import make_policy
from planner.sim import FaultConfig, SimConfig, Simulator, SimTrainerConfig, WorkerConfig, make_workload
from planner.sim.trace import TraceGroup, write_trace
from planner.ledger_audit import audit
from planner.types import PlanContext
from tests.helpers.sim_policies import FifoCapped, NeverTrains


def simulate(tmp_path, policy, ctx, cfg=None, workload=None, seed=0, name="run"):
    run_dir = tmp_path / name
    with LedgerWriter(run_dir / "ledger.jsonl") as ledger:
        wl = make_workload(workload or {"name": "lognormal", "mu": 5.0}, ctx.group_size)
        result = Simulator(policy, ctx, wl, cfg or SimConfig(), seed=seed, ledger=ledger).run()
    (run_dir / "summary.json").write_text(json.dumps(result.summary))
    return result, run_dir


def ledger_events(run_dir, kind):
    return [e for e in read_ledger(run_dir / "ledger.jsonl") if e["event"] == kind]


def test_a_run_is_a_function_of_its_seed(tmp_path):
    ctx = PlanContext(8, 4, 2, 20)
    cfg = SimConfig(faults=FaultConfig(rate=20.0, restart_after=30.0))
    runs = [simulate(tmp_path, make_policy("nemo_windowed", ctx), ctx, cfg, seed=s, name=f"r{i}")
            for i, s in enumerate([3, 3, 4])]
    texts = [(d / "ledger.jsonl").read_text() for _, d in runs]
    assert texts[0] == texts[1] and texts[0] != texts[2]
    drop_wall = [{k: v for k, v in r.summary.items() if k != "wall_s"} for r, _ in runs]
    assert drop_wall[0] == drop_wall[1] != drop_wall[2]


@pytest.mark.parametrize("name", ["lookahead", "nemo_in_order", "verl_drop", "prime_rl", "dressage", "areal",
                                  "torchtitan_windowed_fifo", "tinker_paced"])
@pytest.mark.parametrize("sync_mode", ["partial", "drain", "pinned"])
def test_every_admitted_group_is_trained_or_dropped_exactly_once(tmp_path, name, sync_mode):
    ctx = PlanContext(8, 4, 1, 15)
    cfg = SimConfig(workers=WorkerConfig(num_workers=3, sync_mode=sync_mode, max_concurrency=16),
                    faults=FaultConfig(events=({"time": 40.0, "worker": 0},), recovery="regenerate", restart_after=20.0))
    result, run_dir = simulate(tmp_path, make_policy(name, ctx), ctx, cfg)
    bound = make_policy(name, ctx).staleness_bound()  # η, or a strict policy's looser own bound; None: not strict
    report = audit(run_dir, max_staleness=bound)
    assert not result.deadlock
    assert report.lost == [] and report.trained_twice == [] and report.errors == []
    s = result.summary
    assert s["groups_admitted"] == s["groups_trained"] + s["groups_dropped"] == report.groups_admitted
    assert (s["tokens_trained"], s["staleness_histogram"]) == (report.tokens_trained, report.staleness_histogram)
    if bound is not None:
        assert report.ok and report.max_token_staleness <= bound, report.verdict()
    if name == "lookahead":
        assert s["groups_dropped"] == 0 and s["groups_trained"] == 8 * 15


def trace(tmp_path, lengths):
    path = tmp_path / "trace.jsonl"
    write_trace(path, [TraceGroup(i, tuple(l), prompt_tokens=0) for i, l in enumerate(lengths)])
    return {"name": "trace", "path": str(path)}


@pytest.mark.parametrize(("sync_mode", "expected"), [("partial", [[0, 9], [1, 1]]), ("drain", [[0, 10]])])
def test_drain_keeps_one_version_per_group_and_inflight_splits_at_the_update(tmp_path, sync_mode, expected):
    # one worker, 1 s a decode step; g0 (4 tokens) is trained 4..9 s, so v1 reaches the worker at t=9:
    # g1 (10 tokens, started at 0) has 9 tokens on v0 then; drain finishes g1 on v0 before loading.
    ctx = PlanContext(1, 1, None, 4)
    cfg = SimConfig(workers=WorkerConfig(num_workers=1, decode_alpha=1.0, decode_beta=0.0, prefill_per_token=0.0,
                                         t_sync=0.0, sync_mode=sync_mode), trainer=SimTrainerConfig(c0=5.0, c1=0.0))
    _, run_dir = simulate(tmp_path, FifoCapped(ctx, cap=3), ctx, cfg, workload=trace(tmp_path, [[4], [10]]))
    trained = {g["uid"]: g["versions"] for e in ledger_events(run_dir, "train") for g in e["groups"]}
    assert trained[1] == expected
    if sync_mode == "drain":
        assert all(len(v) == 1 for v in trained.values())


@pytest.mark.parametrize("recovery", ["resume", "regenerate"])
def test_a_fault_loses_no_group_and_resume_keeps_the_generated_tokens(tmp_path, recovery):
    ctx = PlanContext(4, 4, 2, 12)
    cfg = SimConfig(workers=WorkerConfig(num_workers=2, decode_alpha=0.1, decode_beta=0.0),
                    faults=FaultConfig(events=({"time": 20.0, "worker": 0}, {"time": 45.0, "worker": 1}),
                                       recovery=recovery, restart_after=5.0))
    result, run_dir = simulate(tmp_path, make_policy("lookahead", ctx), ctx, cfg,
                               workload=trace(tmp_path, [[300, 200, 100, 50]]))
    s = result.summary
    assert audit(run_dir).ok and s["groups_dropped"] == 0 and s["readmissions"] > 0
    # every trained group holds exactly its lengths, whatever was lost on the way
    assert all(sum(t for _, t in g["versions"]) == 650 for e in ledger_events(run_dir, "train") for g in e["groups"])
    if recovery == "resume":
        assert s["tokens_wasted"] == 0
        assert len(ledger_events(run_dir, "start")) > len(ledger_events(run_dir, "admit")) - s["readmissions"]
    else:
        assert s["tokens_wasted"] > 0


def test_a_cluster_that_dies_for_good_is_reported_as_a_deadlock(tmp_path):
    ctx = PlanContext(4, 2, 2, 10)
    cfg = SimConfig(workers=WorkerConfig(num_workers=1), faults=FaultConfig(events=({"time": 5.0, "worker": 0},)))
    result, run_dir = simulate(tmp_path, make_policy("lookahead", ctx), ctx, cfg)
    assert result.deadlock and result.summary["deadlock"] and result.summary["steps"] < 10
    assert audit(run_dir).lost == []  # finish() still ledgers the untrained groups as end_of_run drops


def test_a_policy_that_never_selects_a_batch_is_a_deadlock(tmp_path):
    ctx = PlanContext(4, 2, 2, 5)
    result, _ = simulate(tmp_path, NeverTrains(ctx), ctx)
    assert result.deadlock and result.summary["steps"] == 0


def test_busy_fractions_and_throughput_come_from_simulated_time(tmp_path):
    ctx = PlanContext(8, 4, 2, 20)
    result, _ = simulate(tmp_path, make_policy("lookahead", ctx), ctx)
    s, steps = result.summary, result.steps
    assert len(steps) == 20 and steps[-1]["end_s"] == s["elapsed_s"]
    busy = sum(r["end_s"] - r["start_s"] for r in steps)
    assert abs(s["trainer_busy_fraction"] - busy / s["elapsed_s"]) < 1e-9
    assert 0 < s["generator_busy_fraction"] <= 1 and abs(s["steps_per_hour"] - 20 * 3600 / s["elapsed_s"]) < 1e-6
    assert max(r["max_staleness_in_batch"] for r in steps) == s["max_token_staleness"] <= 2


def test_bad_cluster_configs_name_the_field():
    with pytest.raises(ValueError, match="sim.workers.speeds has 1 entries"):
        build(SimConfig, {"workers": {"num_workers": 2, "speeds": [1.0]}}, "sim")
    with pytest.raises(ValueError, match="sim.faults.events worker=5"):
        build(SimConfig, {"faults": {"events": [{"time": 1.0, "worker": 5}]}}, "sim")
    with pytest.raises(ValueError, match="sim.trainer.c2: unknown key"):
        build(SimConfig, {"trainer": {"c2": 1.0}}, "sim")
    ctx = PlanContext(4, 8, 2, 5)
    with pytest.raises(ValueError, match="max_concurrency=4: must be >= group_size=8"):
        Simulator(FifoCapped(ctx), ctx, make_workload({"name": "lognormal"}, 8),
                  build(SimConfig, {"workers": {"max_concurrency": 4}}, "sim"), seed=0)


def test_the_simulator_runs_tens_of_thousands_of_trajectories_a_second():
    ctx = PlanContext(32, 8, 2, 100)  # 25,600 trajectories
    t0 = time.perf_counter()
    result = Simulator(make_policy("nemo_in_order", ctx), ctx, make_workload({"name": "lognormal"}, 8),
                       SimConfig(), seed=0).run()
    rate = result.summary["trajectories_trained"] / (time.perf_counter() - t0)
    assert result.summary["trajectories_trained"] == 25_600 and rate > 10_000, rate


@pytest.mark.parametrize("name", ["lookahead", "verl_drop", "trl", "prime_rl", "nemo_windowed"])
def test_the_summary_length_bias_is_the_audits_and_only_drop_policies_are_biased_to_short(tmp_path, name):
    ctx = PlanContext(8, 4, 1, 30)
    result, run_dir = simulate(tmp_path, make_policy(name, ctx), ctx, workload={"name": "heavy_tail"})
    report = audit(run_dir, 1)
    assert report.lost == [] and report.length_bias == result.summary["length_bias"]
    drops = ledger_events(run_dir, "drop")
    # a drop records the workload's true length, at least what it had generated
    assert all(e["length"] >= e["tokens"] for e in drops) and any(e["length"] > e["tokens"] for e in drops) == bool(drops)
    bias = report.length_bias
    if name == "lookahead":
        assert not drops and bias == {"ks": 0.0, "mean_length_ratio": 1.0}
    else:  # heavy tails: the stale groups a baseline drops are the long ones
        assert len(drops) > 10 and bias["ks"] > 0.1 and bias["mean_length_ratio"] < 0.9, bias


def test_the_compile_warm_up_delays_the_first_decode_and_the_first_step_and_leaves_the_steady_state(tmp_path):
    ctx = PlanContext(4, 2, 1, 12)
    trainer = {"c0": 1.0, "c1": 1e-4, "wait_sync": True}

    def run(name, worker_compile, trainer_compile):
        cfg = SimConfig(workers=WorkerConfig(num_workers=1, compile_s=worker_compile),
                        trainer=SimTrainerConfig(**trainer, compile_s=trainer_compile))
        return simulate(tmp_path, make_policy("lookahead", ctx), ctx, cfg, name=name)[0]

    plain, warm = run("plain", 0.0, 0.0), run("warm", 7.0, 11.0)
    first, later = plain.steps[0], warm.steps[0]
    # The first batch waits for the engine's compile; the first step takes the trainer's compile on top.
    assert later["start_s"] == pytest.approx(first["start_s"] + 7.0)
    assert later["end_s"] - later["start_s"] == pytest.approx(first["end_s"] - first["start_s"] + 11.0)
    assert warm.summary["elapsed_s"] > plain.summary["elapsed_s"] + 7.0  # the whole run pays the warm-up
    assert warm.summary["steps_per_hour_steady"] == pytest.approx(plain.summary["steps_per_hour_steady"], rel=0.05)
