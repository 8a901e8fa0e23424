"""Multi-turn episodes in the simulator (planner/sim/episodes.py, `workload=multi_turn`): every
policy runs on them under the audit, turns use the engine and environment steps do not, and
tail scheduling and faults act on the remaining turns."""

import json

import numpy as np
import pytest

import planner.policies  # noqa: F401  (registers the baselines)
import planner.policies.lookahead  # noqa: F401
from planner.ledger import LedgerWriter, read_ledger
from planner.ledger_audit import audit
from planner.registry import POLICIES, make_policy
from planner.sim import FaultConfig, SimConfig, Simulator, SimTrainerConfig, WorkerConfig, make_workload
from planner.sim.config import SpeculationSimConfig
from planner.types import PlanContext

# Short turns, a second-long environment with a tail, and a few failures: several turns of a
# group straddle a weight update within a 12-step run.
EPISODES = {"name": "multi_turn", "turns_mean": 3.0, "max_turns": 5, "turn_mu": 4.0, "max_turn_tokens": 256,
            "env_mu": 0.0, "env_tail_p": 0.1, "env_tail_scale": 3.0, "env_timeout_s": 20.0, "env_fail_p": 0.05}
CLUSTER = SimConfig(workers=WorkerConfig(num_workers=2, max_concurrency=32), trainer=SimTrainerConfig(c0=2.0, c1=1e-4))


def simulate(tmp_path, name, ctx, cfg=CLUSTER, workload=None, seed=0, run="run"):
    run_dir = tmp_path / run
    policy = make_policy(name, ctx)
    with LedgerWriter(run_dir / "ledger.jsonl") as ledger:
        wl = make_workload(workload or EPISODES, ctx.group_size)
        result = Simulator(policy, ctx, wl, cfg, seed=seed, ledger=ledger).run()
    (run_dir / "summary.json").write_text(json.dumps(result.summary))
    return result, run_dir, policy


def trained_groups(run_dir):
    return [g for e in read_ledger(run_dir / "ledger.jsonl") if e["event"] == "train" for g in e["groups"]]


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_every_policy_runs_multi_turn_episodes_under_the_audit(tmp_path, name):
    ctx = PlanContext(6, 4, 2, 12)  # η=2: verl at η=1 admits a batch only once the last one trained
    result, run_dir, policy = simulate(tmp_path, name, ctx)
    report = audit(run_dir, max_staleness=policy.staleness_bound())
    assert not result.deadlock and report.errors == [] and report.lost == [] and report.trained_twice == []
    groups = trained_groups(run_dir)
    assert groups and all("turns" in g for g in groups)
    assert report.episodes == 4 * len(groups) and report.turns > report.episodes  # more than one turn each
    if policy.staleness_bound() is not None:  # strict: zero violations, the exact bound
        assert report.ok and report.violations == 0, report.verdict()
    # non-trivial: some sample's turns span two weight versions
    spanning = [g for g in groups if len({v for _, span in g["turns"] for v, t in span if t}) > 1]
    assert spanning, "no group's turns span two versions: the run proves nothing about turns"
    assert result.summary["episodes"]["groups_spanning_versions"] > 0


def test_a_later_turn_starts_on_the_newest_weights_the_engine_holds(tmp_path):
    # Workers load each version at different times (a lag, one slow to load): a turn that ends on
    # one worker may be queued on another that still holds older weights.
    ctx = PlanContext(6, 4, 2, 12)
    cfg = SimConfig(workers=WorkerConfig(num_workers=3, max_concurrency=32, load_lag=2.0, t_sync=3.0),
                    trainer=SimTrainerConfig(c0=2.0, c1=1e-4))
    _, run_dir, _ = simulate(tmp_path, "lookahead", ctx, cfg)
    assert audit(run_dir).ok
    later = 0
    for g in trained_groups(run_dir):
        by_sample = {}
        for sample, span in g["turns"]:
            by_sample.setdefault(sample, []).append([v for v, t in span if t])
        for turns in by_sample.values():
            for before, after in zip(turns, turns[1:]):
                assert min(after) >= max(before)
                later += min(after) > max(before)
    assert later > 0  # turns that started after an update sampled on the newer weights


def test_environment_time_holds_no_engine_slot_and_engine_speed_cannot_shorten_it(tmp_path):
    # One-token turns, a fixed 5 s environment step: the group's life is its environment steps.
    slow_env = {**EPISODES, "turn_mu": 0.0, "turn_sigma": 0.0, "max_turn_tokens": 1, "env_mu": np.log(5.0),
                "env_sigma": 0.0, "env_tail_p": 0.0, "env_fail_p": 0.0, "turns_mean": 3.0, "max_turns": 3}
    ctx = PlanContext(2, 2, 1, 4)
    runs = {}
    for alpha in (0.03, 0.003):
        cfg = SimConfig(workers=WorkerConfig(num_workers=1, max_concurrency=4, decode_alpha=alpha, t_sync=0.0),
                        trainer=SimTrainerConfig(c0=0.1, c1=0.0))
        result, run_dir, _ = simulate(tmp_path, "lookahead", ctx, cfg, slow_env, run=f"a{alpha}")
        assert audit(run_dir).ok
        runs[alpha] = result.summary
    for s in runs.values():
        split = s["tail"]["episodes"]
        assert split["per_turn_s"]["environment"]["p50"] == pytest.approx(5.0)
        assert split["share"]["environment"] > 0.9
    # a 10x faster engine saves only the turns' few seconds: 3 environment steps of 5 s stay
    assert runs[0.003]["elapsed_s"] > 0.9 * runs[0.03]["elapsed_s"]


def test_failed_environment_steps_end_episodes_whose_tokens_still_train(tmp_path):
    ctx = PlanContext(6, 4, 1, 10)
    result, run_dir, _ = simulate(tmp_path, "lookahead", ctx, workload={**EPISODES, "env_fail_p": 0.3})
    e = result.summary["episodes"]
    assert e["faults"].get("error", 0) > 0 and e["fault_tokens_trained"] > 0
    assert e["turns"] < 3.0 * e["episodes"]  # failures cut episodes short
    assert result.summary["groups_dropped"] == 0 and audit(run_dir).ok


@pytest.mark.parametrize("recovery", ["resume", "regenerate"])
def test_a_worker_fault_mid_episode_loses_no_group_and_trains_no_turn_twice(tmp_path, recovery):
    ctx = PlanContext(6, 4, 1, 12)
    cfg = SimConfig(workers=WorkerConfig(num_workers=3, max_concurrency=32),
                    trainer=SimTrainerConfig(c0=2.0, c1=1e-4),
                    faults=FaultConfig(events=({"time": 15.0, "worker": 0}, {"time": 40.0, "worker": 1}),
                                       recovery=recovery, restart_after=5.0))
    result, run_dir, _ = simulate(tmp_path, "lookahead", ctx, cfg)
    report = audit(run_dir)
    assert report.ok, report.verdict()
    assert result.summary["readmissions"] > 0 and result.summary["groups_dropped"] == 0
    assert (result.summary["tokens_wasted"] > 0) == (recovery == "regenerate")


def test_tail_scheduling_acts_on_the_remaining_turns(tmp_path):
    ctx = PlanContext(6, 4, 1, 12)
    uneven = SimConfig(workers=WorkerConfig(num_workers=3, max_concurrency=32, speeds=(1.0, 1.0, 0.25),
                                            speculation=SpeculationSimConfig(when="critical")),
                       trainer=SimTrainerConfig(c0=2.0, c1=1e-4))
    policy = make_policy("lookahead", ctx, {"migrate": True})
    run_dir = tmp_path / "tail"
    with LedgerWriter(run_dir / "ledger.jsonl") as ledger:
        result = Simulator(policy, ctx, make_workload(EPISODES, ctx.group_size), uneven, seed=0, ledger=ledger).run()
    (run_dir / "summary.json").write_text(json.dumps(result.summary))
    s = result.summary
    assert s["speculation"]["groups_marked"] > 0 and s.get("groups_migrated", 0) > 0
    report = audit(run_dir)
    assert report.ok and report.migrations > 0, report.verdict()


def test_a_multi_turn_run_is_a_function_of_its_seed(tmp_path):
    ctx = PlanContext(4, 4, 1, 6)
    texts = [(simulate(tmp_path, "lookahead", ctx, seed=s, run=f"r{i}")[1] / "ledger.jsonl").read_text()
             for i, s in enumerate([1, 1, 2])]
    assert texts[0] == texts[1] != texts[2]
