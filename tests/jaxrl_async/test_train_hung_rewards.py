"""`python -m jaxrl_async.train` with a user reward function that hangs, as an operator would run it:
the run finishes and the process exits 0 in bounded time, later rewards still score, and every
error's reason is in the log and counted by kind in summary.json (tasks/rewards.py)."""

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.helpers import REPO
from tests.helpers.train_runs import QUIET

pytestmark = pytest.mark.slow

_calls = 0
_lock = threading.Lock()


def _hang_first(k: int, completion_text: str, answer) -> float:
    """Hangs forever on the process's first `k` calls, then scores like repeat_letter."""
    global _calls
    with _lock:
        _calls += 1
        hang = _calls <= k
    if hang:
        threading.Event().wait()
    return completion_text.count(answer) / max(1, len(completion_text))


def hang_once(prompt_text: str, completion_text: str, answer) -> float:
    return _hang_first(1, completion_text, answer)


def hang_six_times(prompt_text: str, completion_text: str, answer) -> float:
    return _hang_first(6, completion_text, answer)


@pytest.mark.parametrize("fn, hangs", [("hang_once", 1), ("hang_six_times", 6)])
def test_a_reward_function_that_hangs_costs_rewards_never_the_run_and_the_process_exits(tmp_path, fn, hangs):
    run_dir = tmp_path / "run"
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(REPO)}
    t0 = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "jaxrl_async.train", *QUIET, f"hydra.run.dir={run_dir}", "steps=3", "batch_groups=2",
         "group_size=4", "max_new_tokens=4", "task.reward_timeout_s=1",
         f"task.reward_fn=tests.jaxrl_async.test_train_hung_rewards:{fn}"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    wall_s = time.monotonic() - t0
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert wall_s < 100, wall_s
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["completed"] and summary["audit_ok"] and summary["steps"] == 3
    # Six hung calls are more than asyncio's default pool takes on 2 cores (min(32, cores + 4)):
    # had they shared it, every later reward would time out too.
    assert summary["reward_errors_by_type"] == {"timeout": hangs} and summary["reward_errors"] == hangs
    assert summary["rewards_scored"] >= 3 * 2 * 4 > hangs
    log = proc.stdout + proc.stderr + (run_dir / "train.log").read_text() if (run_dir / "train.log").exists() \
        else proc.stdout + proc.stderr
    assert f"reward {fn} timed out after 1s" in log, log[-3000:]
    assert f"reward errors by kind: timeout {hangs}" in log
