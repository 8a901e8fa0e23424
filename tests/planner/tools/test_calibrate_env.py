"""`planner.calibrate` fits the multi-turn environment terms (planner/tools/calibrate_env.py) from a
trace's `episode` lines: the workload that made them is recovered and the replay runs it."""

import shlex
import subprocess
import sys

import numpy as np
import pytest

from planner.configs import build
from planner.ledger_audit import audit
from planner.run_trace import TraceWriter
from planner.sim.workloads import MultiTurnParams, make_workload
from planner.tools.calibrate import calibrate, main
from planner.tools.calibrate_env import environment
from tests.planner.tools.test_calibrate import synthetic_run

TRUE = {"name": "multi_turn", "turns_mean": 3.0, "max_turns": 8, "turn_mu": 4.5, "turn_sigma": 0.4,
        "prompt_sigma": 0.0, "env_mu": 0.5, "env_sigma": 0.4, "env_tail_p": 0.05, "env_tail_scale": 8.0,
        "env_tail_alpha": 1.5, "env_timeout_s": 100.0, "env_fail_p": 0.05, "prompt_tokens": 40}


def with_episodes(run_dir, groups=1500, n=2):
    """The synthetic run's trace, plus `groups` finished multi-turn groups drawn from `TRUE`: their
    admit and finish lines and one `episode` line per sample (queued 0, generation 1 s a turn)."""
    draws = make_workload(TRUE, n).sample(np.random.default_rng(0), groups)
    trace = TraceWriter(run_dir / "trace.jsonl", append=True)
    for i, samples in enumerate(draws.episodes):
        uid = 10_000 + i
        trace.write("admit", 1.0, uid=uid, attempt=0, prompt_id=f"e{i}", prompt_tokens=40, version=0)
        trace.write("finish", 2.0, uid=uid, attempt=0, lengths=draws.lengths[i].tolist())
        for j, e in enumerate(samples):
            trace.write("episode", 2.0, uid=uid, sample=j, turns=[[0.0, 1.0, s] for s in e.env_s], fault=e.fault)
    trace.close()
    return run_dir


def test_the_environment_terms_that_made_the_episodes_are_recovered(tmp_path):
    cal = calibrate(with_episodes(synthetic_run(tmp_path / "run")))
    env = cal["fit"]["environment"]
    w = env["workload"]
    assert env["episodes"] == 3000 and env["faults"]["other"] > 0 and env["faults"]["timeout"] >= 0
    # turns of the episodes that ended on their own: 1 + Poisson(2), capped at 8
    assert w["turns_mean"] == pytest.approx(3.0, rel=0.05) and w["max_turns"] <= 8
    # tokens per turn: the per-episode mean of log-normal(4.5, 0.4) turns
    assert w["turn_mu"] == pytest.approx(4.5 + 0.4**2 / 2, abs=0.15)
    assert w["env_mu"] == pytest.approx(0.5, abs=0.1) and w["env_sigma"] == pytest.approx(0.4, abs=0.1)
    assert w["env_tail_p"] == pytest.approx(0.05, abs=0.01)
    assert w["env_tail_alpha"] == pytest.approx(1.5, rel=0.4)
    assert w["env_fail_p"] == pytest.approx(0.05, rel=0.25)
    assert w["prompt_tokens"] == 40
    build(MultiTurnParams, {k: v for k, v in w.items() if k != "name"}, "workload")  # what the replay builds


def test_a_trace_without_episode_lines_has_no_environment_terms(tmp_path):
    cal = calibrate(synthetic_run(tmp_path / "run"))
    assert "environment" not in cal["fit"] and "workload=trace" in cal["run"]["replay"]
    assert environment([], [], []) is None


def test_the_replay_of_a_multi_turn_run_simulates_the_fitted_episodes_under_the_audit(tmp_path, capsys):
    run_dir = with_episodes(synthetic_run(tmp_path / "run"), groups=300)
    assert main([str(run_dir)]) == 0
    out = capsys.readouterr().out
    assert "environment: 600 episodes" in out
    replay = [line for line in out.splitlines() if line.startswith("replay: ")][0]
    argv = shlex.split(replay.removeprefix("replay: "))
    assert "workload=multi_turn" in argv and not any(a.startswith("workload.path=") for a in argv)
    p = subprocess.run([sys.executable, *argv[1:]], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    report = audit(run_dir / "replay")
    assert report.ok and report.episodes > 0, report.verdict()
