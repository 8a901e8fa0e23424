"""Reward faults, as an operator meets them: `python -m jaxrl_async.train` with a user `reward_fn`
that hangs, raises, or fails for most prompts (tasks/reward_pool.py, runtime/scoring.py).

Each case asserts what the operator sees: the run ends within a bound, at most 2 lines on stderr
when it fails, `python -m planner.audit` passes on its ledger (a stopped run's once resumed), and no fabricated reward was
trained: every trained step's `reward_mean` equals the one recomputed from the ledger's groups
and the reward each prompt really has (WORKING for a prompt whose reward works, the fallback 0.0
for one whose reward fails) — the old hung-call cap turned working prompts' rewards into 0.0.
"""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import REPO
from tests.helpers.reward_fns import FIXED, WORKING
from tests.helpers.train_runs import QUIET

pytestmark = pytest.mark.slow

HERE = "tests.helpers.reward_fns"  # light to import: a killed worker's replacement starts at once
SMALL = ["steps=3", "batch_groups=4", "group_size=2", "max_new_tokens=4", "max_staleness=1"]
# One prompt in 8 starts with "c", one with "b", the others with neither.
PROMPTS = ["apple", "cherry", "avocado", "banana", "apricot", "almond", "acai", "artichoke"]


def _train(tmp_path: Path, fn: str, *extra: str, env: dict | None = None, timeout_s: float = 400):
    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps({"prompt": p, "answer": "a"}) + "\n" for p in PROMPTS))
    run_dir = tmp_path / "run"
    t0 = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "jaxrl_async.train", *QUIET, f"hydra.run.dir={run_dir}", *SMALL, "task=custom",
         f"task.path={data}", f"task.reward_fn={HERE}:{fn}", *extra],
        cwd=REPO, env={**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(REPO), **(env or {})},
        capture_output=True, text=True, timeout=timeout_s)
    return proc, time.monotonic() - t0, run_dir


def _audit(run_dir: Path, *flags: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "planner.audit", str(run_dir), "--max-staleness", "1", *flags],
                          cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True)


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _assert_rewards_real(run_dir: Path, fails) -> list[float]:
    """Every trained step's reward_mean is the mean of its groups' real rewards (module docstring)."""
    ledger = _jsonl(run_dir / "ledger.jsonl")
    prompt_of = {e["uid"]: PROMPTS[int(e["prompt"].rsplit("-", 1)[1]) - 1] for e in ledger if e["event"] == "admit"}
    expected = {e["step"]: sum(0.0 if fails(prompt_of[g["uid"]]) else WORKING for g in e["groups"]) / len(e["groups"])
                for e in ledger if e["event"] == "train"}
    got = {m["step"]: m["reward_mean"] for m in _jsonl(run_dir / "metrics.jsonl")}
    assert got == pytest.approx(expected), (got, expected)
    return list(got.values())


def test_a_reward_that_hangs_on_some_prompts_is_killed_and_the_others_train_on_their_real_rewards(tmp_path):
    proc, wall_s, run_dir = _train(tmp_path, "hangs_on_c_else_working", "task.reward_timeout_s=1")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert len(proc.stderr.strip().splitlines()) <= 2, proc.stderr  # the log goes to stdout and train.log
    assert wall_s < 300, wall_s
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["completed"] and summary["steps"] == 3
    hung = summary["reward_errors_by_type"].get("timeout", 0)
    assert summary["reward_errors_by_type"] == {"timeout": hung} and summary["reward_errors"] == hung
    assert hung % 2 == 0 and hung >= 2  # the cherry groups: every sample killed at its deadline
    means = _assert_rewards_real(run_dir, lambda p: p.startswith("c"))
    assert min(means) > 0  # non-trivially nonzero: what the old cap's fabricated zeros were not
    assert "timed out after 1s (its worker process was killed)" in proc.stdout
    assert f"reward errors: {hung} (timeout {hung})" in proc.stdout  # the final report, by kind
    audit = _audit(run_dir)
    assert audit.returncode == 0 and "PASS" in audit.stdout, audit.stdout


def test_a_raising_reward_falls_back_for_its_samples_only(tmp_path):
    proc, wall_s, run_dir = _train(tmp_path, "raises_on_b_else_working")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert len(proc.stderr.strip().splitlines()) <= 2, proc.stderr
    assert wall_s < 300, wall_s
    summary = json.loads((run_dir / "summary.json").read_text())
    raised = summary["reward_errors_by_type"].get("ValueError", 0)
    assert summary["reward_errors_by_type"] == {"ValueError": raised} and raised >= 2
    _assert_rewards_real(run_dir, lambda p: p.startswith("b"))
    assert "raised ValueError: no reference answer for 'banana'" in proc.stdout
    assert f"reward errors: {raised} (ValueError {raised})" in proc.stdout
    audit = _audit(run_dir)
    assert audit.returncode == 0 and "PASS" in audit.stdout, audit.stdout


def test_a_reward_failing_for_most_prompts_stops_the_run_with_one_error_and_a_checkpoint_and_resume_continues(
        tmp_path):
    proc, wall_s, run_dir = _train(tmp_path, "fails_unless_apple")
    assert wall_s < 300, wall_s
    assert proc.returncode == 1, proc.stdout[-3000:]
    errors = proc.stderr.strip().splitlines()
    assert 1 <= len(errors) <= 2 and errors[-1].startswith("error: ") and "task.max_reward_failure_rate=0.5" in errors[-1]
    assert f"resume={run_dir}" in errors[-1]
    assert any((run_dir / "checkpoints").iterdir())
    assert not (run_dir / "summary.json").exists()
    # Stopped before the first batch: the failed rewards never reached one.
    assert _assert_rewards_real(run_dir, lambda p: p != "apple") == []
    # The audit of a stopped run's ledger counts its in-flight groups as lost (they are in the
    # checkpoint, regenerated on resume); everything else must hold. The resumed run's ledger passes.
    stopped = json.loads(_audit(run_dir, "--json").stdout)
    assert stopped["violations"] == 0 and not stopped["trained_twice"] and not stopped["errors"]
    assert stopped["lost"] == sorted(e["uid"] for e in _jsonl(run_dir / "ledger.jsonl") if e["event"] == "admit")

    resumed, _, _ = _train(tmp_path, "fails_unless_apple", f"resume={run_dir}", env={FIXED: "1"})
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["completed"] and summary["steps"] == 3 and summary["audit_ok"]
    assert min(_assert_rewards_real(run_dir, lambda p: False)) == WORKING
    audit = _audit(run_dir)
    assert audit.returncode == 0 and "PASS" in audit.stdout, audit.stdout
