"""Version-pinned generation in the simulator (`sim.workers.sync_mode=pinned`, issue 26 item 3):
one version per sequence, no update stall, K resident versions and the loads that wait for one."""

import json

import pytest

import planner.policies  # noqa: F401  (registers the baselines)
import planner.policies.lookahead  # noqa: F401
from planner.configs import build
from planner.ledger import LedgerWriter, read_ledger
from planner.ledger_audit import audit
from planner.registry import POLICIES, make_policy
from planner.sim import FaultConfig, SimConfig, Simulator, SimTrainerConfig, WorkerConfig, make_workload
from planner.sim.tail import SimTail
from planner.sim.trace import TraceGroup, write_trace
from planner.types import PlanContext
from tests.helpers.sim_policies import FifoCapped


def simulate(tmp_path, policy, ctx, cfg, workload=None, seed=0, name="run"):
    run_dir = tmp_path / name
    with LedgerWriter(run_dir / "ledger.jsonl") as ledger:
        wl = make_workload(workload or {"name": "lognormal", "mu": 5.0}, ctx.group_size)
        result = Simulator(policy, ctx, wl, cfg, seed=seed, ledger=ledger).run()
    (run_dir / "summary.json").write_text(json.dumps(result.summary))
    return result, run_dir


def events(run_dir, kind):
    return [e for e in read_ledger(run_dir / "ledger.jsonl") if e["event"] == kind]


def workers(sync_mode, resident_versions=None, **over):
    return SimConfig(workers=WorkerConfig(num_workers=3, max_concurrency=16, sync_mode=sync_mode,
                                          resident_versions=resident_versions, **over))


def test_under_pinned_every_group_trains_on_one_version_the_one_it_started_on(tmp_path):
    ctx = PlanContext(8, 4, 2, 20)
    runs = {mode: simulate(tmp_path, make_policy("lookahead", ctx), ctx, workers(mode), name=mode)
            for mode in ("partial", "pinned")}
    # The same run under partial rollout has updates that reach groups mid-sequence.
    partial = [g for e in events(runs["partial"][1], "train") for g in e["groups"]]
    assert sum(len(g["versions"]) > 1 for g in partial) > 10
    run_dir = runs["pinned"][1]
    started = {e["uid"]: e["version"] for e in events(run_dir, "start")}
    trained = [g for e in events(run_dir, "train") for g in e["groups"]]
    assert len(trained) == 8 * 20
    assert all([v for v, _ in g["versions"]] == [started[g["uid"]]] for g in trained)
    assert len({started[g["uid"]] for g in trained}) >= 10  # updates did happen: many versions in all
    report = audit(run_dir, max_staleness=2)
    assert report.ok and report.groups_dropped == 0, report.verdict()


def trace(tmp_path, lengths):
    path = tmp_path / "trace.jsonl"
    write_trace(path, [TraceGroup(i, tuple(l), prompt_tokens=0) for i, l in enumerate(lengths)])
    return {"name": "trace", "path": str(path)}


@pytest.mark.parametrize("sync_mode", ["partial", "pinned"])
def test_a_pinned_update_costs_no_swap_time_and_leaves_the_running_group_on_its_version(tmp_path, sync_mode):
    # one worker, 1 s a decode step; g0 (4 tokens) trains 4..9 s, so v1 reaches the worker at t=9 while
    # g1 (10 tokens, started at 0) runs: partial splits g1 there and stalls t_sync; pinned does neither.
    ctx = PlanContext(1, 1, None, 4)
    out = {}
    for t_sync in (0.0, 3.0):
        cfg = SimConfig(workers=WorkerConfig(num_workers=1, decode_alpha=1.0, decode_beta=0.0, prefill_per_token=0.0,
                                             t_sync=t_sync, sync_mode=sync_mode),
                        trainer=SimTrainerConfig(c0=5.0, c1=0.0))
        result, run_dir = simulate(tmp_path, FifoCapped(ctx, cap=3), ctx, cfg, workload=trace(tmp_path, [[4], [10]]),
                                   name=f"t{t_sync}")
        trained = {g["uid"]: g["versions"] for e in events(run_dir, "train") for g in e["groups"]}
        out[t_sync] = (trained[1], result.summary["elapsed_s"], result.summary["tail"]["update_load_s"])
    if sync_mode == "partial":
        assert out[0.0][0] == [[0, 9], [1, 1]] and out[3.0][1] > out[0.0][1] and out[3.0][2] > 0
    else:
        assert out[0.0] == out[3.0] == ([[0, 10]], out[0.0][1], 0.0)


@pytest.mark.parametrize("eta", [1, 2])
def test_one_resident_version_makes_updates_wait_and_eta_plus_one_never_does(tmp_path, eta):
    # A strict no-drop policy trains every running group at a step >= the loading version v, so its
    # version is in [v - η, v - 1]: with the new one that is at most η + 1 versions (docs/design.md §4).
    ctx = PlanContext(8, 4, eta, 20)
    held = {}
    for k in (1, eta, eta + 1):
        for seed in (0, 1):
            result, run_dir = simulate(tmp_path, make_policy("lookahead", ctx), ctx, workers("pinned", k), seed=seed,
                                       name=f"k{k}s{seed}")
            u = result.summary["weight_updates"]
            assert u["resident_versions"] == k and u["max_resident"] <= k
            report = audit(run_dir, max_staleness=eta)
            assert report.ok and report.groups_dropped == 0, report.verdict()
            held[k] = held.get(k, 0) + u["held_loads"]
            if k == eta + 1:
                assert u["max_resident"] == eta + 1 and result.summary["tail"]["update_held_s"] == 0
    assert held[1] > 0 and held[eta] > 0 and held[eta + 1] == 0


def test_with_one_resident_version_pinned_is_drain_without_the_swap(tmp_path):
    ctx = PlanContext(8, 4, 1, 15)
    ledgers = []
    for name, cfg in (("drain", workers("drain", t_sync=0.0)), ("pinned", workers("pinned", 1, t_sync=2.0))):
        simulate(tmp_path, make_policy("lookahead", ctx), ctx, cfg, name=name)
        ledgers.append((tmp_path / name / "ledger.jsonl").read_text())
    assert ledgers[0] == ledgers[1]


@pytest.mark.parametrize("value", [0, -1, 1.5, True, "two"])
def test_resident_versions_must_be_a_positive_int(value):
    with pytest.raises(ValueError, match=r"^sim\.workers\.resident_versions="):
        build(SimConfig, {"workers": {"sync_mode": "pinned", "resident_versions": value}}, "sim")


def test_resident_versions_given_without_pinned_is_a_warning_and_the_default_is_four():
    assert WorkerConfig(sync_mode="pinned").resident == 4 and WorkerConfig(sync_mode="pinned").idle_keys() == []
    (warning,) = WorkerConfig(sync_mode="drain", resident_versions=2).idle_keys()
    assert warning.startswith("sim.workers.resident_versions=2: has no effect with sim.workers.sync_mode=drain")
    assert WorkerConfig(sync_mode="partial").idle_keys() == []


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_every_policy_runs_under_pinned_and_passes_the_audit_at_its_own_bound(tmp_path, name):
    ctx = PlanContext(8, 4, 1, 15)
    cfg = SimConfig(workers=WorkerConfig(num_workers=3, max_concurrency=16, sync_mode="pinned", resident_versions=2),
                    faults=FaultConfig(events=({"time": 40.0, "worker": 0},), recovery="resume", restart_after=20.0))
    result, run_dir = simulate(tmp_path, make_policy(name, ctx), ctx, cfg)
    bound = make_policy(name, ctx).staleness_bound()
    report = audit(run_dir, max_staleness=bound)
    s = result.summary
    assert not result.deadlock and report.errors == [] and report.lost == [] and report.trained_twice == []
    assert s["groups_admitted"] == s["groups_trained"] + s["groups_dropped"] == report.groups_admitted
    assert s["weight_updates"]["loads"] > 0 and s["tail"]["update_load_s"] == 0
    if bound is not None:
        assert report.ok and report.max_token_staleness <= bound, report.verdict()


def test_a_pinned_group_migrates_only_to_a_worker_holding_its_version_and_keeps_it(tmp_path, monkeypatch):
    # Uneven workers (bench_tail's migration case): stragglers on the slow worker move, pinned to their version,
    # some to a worker whose newest is newer; K = η leaves no room for a version the target does not hold.
    late = []  # moves of a group pinned below its target's newest version
    target = SimTail.target

    def counted(self, src, g):
        w = target(self, src, g)
        if w is not None and g.version < w.version:
            late.append(g.uid)
        return w

    monkeypatch.setattr(SimTail, "target", counted)
    ctx = PlanContext(8, 4, 2, 20)
    cfg = build(SimConfig, {"workers": {"num_workers": 3, "speeds": [0.25, 1.0, 1.0], "sync_mode": "pinned",
                                        "resident_versions": 2}}, "sim")
    result, run_dir = simulate(tmp_path, make_policy("lookahead", ctx, {"migrate": True}), ctx, cfg,
                               workload={"name": "heavy_tail"}, seed=0)
    assert len(late) >= 5
    lines = list(read_ledger(run_dir / "ledger.jsonl"))
    started = {e["uid"]: e["version"] for e in lines if e["event"] == "start"}
    trained = [g for e in lines if e["event"] == "train" for g in e["groups"]]
    assert len(trained) == 8 * 20 and all([v for v, _ in g["versions"]] == [started[g["uid"]]] for g in trained)
    assert result.summary["weight_updates"]["max_resident"] <= 2
    report = audit(run_dir, 2)
    assert report.ok and report.migrations > 0 and report.groups_dropped == 0, report.verdict()
