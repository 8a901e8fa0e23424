"""`python -m jaxrl_async.train` as a subprocess, and what its run directory shows while it runs:
for the tests that kill, signal or race real runs (tests/jaxrl_async/test_train_durability.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from tests.helpers import REPO
from tests.helpers.train_runs import QUIET

ORBAX_TMP = "orbax-checkpoint-tmp"


def launch(run_dir: Path, *overrides: str) -> subprocess.Popen:
    """Start a training run in `run_dir` (`overrides` win over QUIET's keys); its stdout and stderr
    go to one text pipe."""
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "HYDRA_FULL_ERROR": "0"}
    keys = {o.split("=", 1)[0] for o in overrides}
    quiet = [o for o in QUIET if o.split("=", 1)[0] not in keys]
    return subprocess.Popen(
        [sys.executable, "-m", "jaxrl_async.train", *quiet, f"hydra.run.dir={run_dir}", *overrides],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def wait_until(proc: subprocess.Popen, condition: Callable[[], bool], what: str, timeout_s: float = 300,
               poll_s: float = 0.002) -> None:
    """Poll `condition` until it holds; the run ending first (or the timeout) fails, showing its log."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if proc.poll() is not None:
            raise AssertionError(f"the run ended (status {proc.returncode}) before {what}:\n"
                                 f"{proc.stdout.read()[-3000:]}")
        if time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(poll_s)


def lines(path: Path) -> list[dict]:
    """The complete JSON lines of a file being written (a torn last line is not one)."""
    if not path.exists():
        return []
    text = path.read_text()
    return [json.loads(line) for line in text.split("\n")[:-1] if line.strip()]


def trained_steps(run_dir: Path) -> list[int]:
    return [e["step"] for e in lines(run_dir / "ledger.jsonl") if e["event"] == "train"]


def untrained_admits(run_dir: Path) -> set[int]:
    """Uids the ledger admitted and neither trained nor dropped: groups in flight."""
    events = lines(run_dir / "ledger.jsonl")
    closed = {g["uid"] for e in events if e["event"] == "train" for g in e["groups"]}
    closed |= {e["uid"] for e in events if e["event"] == "drop"}
    return {e["uid"] for e in events if e["event"] == "admit"} - closed


def trained_prompts(run_dir: Path) -> Counter:
    """The multiset of prompt ids the run's ledger trained (each trained uid's admitted prompt)."""
    events = lines(run_dir / "ledger.jsonl")
    prompt = {e["uid"]: e["prompt"] for e in events if e["event"] == "admit"}
    return Counter(prompt[g["uid"]] for e in events if e["event"] == "train" for g in e["groups"])


def finished_checkpoints(run_dir: Path) -> list[int]:
    folder = run_dir / "checkpoints"
    return sorted(int(p.name) for p in folder.iterdir() if p.name.isdigit()) if folder.exists() else []


def saving_checkpoints(run_dir: Path) -> list[str]:
    """orbax's folders of saves in progress (renamed to the step's number when finished)."""
    folder = run_dir / "checkpoints"
    try:
        return [name for name in os.listdir(folder) if ORBAX_TMP in name]
    except FileNotFoundError:
        return []
