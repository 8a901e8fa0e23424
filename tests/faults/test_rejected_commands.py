"""A rejected `python -m jaxrl_async.train` leaves nothing behind: run from an empty directory,
each bad command is one `error:` line naming the key, a non-zero status, and the directory is
still empty — no `outputs/`, no run directory, no lock (job/preflight.py checks the task's data,
the model, the engine against the model and the devices before Hydra makes its directory). A
`resume=PATH` runs in PATH and makes no `outputs/train/DATE/` either.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import REPO
from tests.helpers.train_runs import QUIET

ENV = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(REPO), "XLA_FLAGS": ""}
SMALL = [*QUIET, "batch_groups=2", "group_size=2", "max_new_tokens=4", "steps=1"]


def _train(cwd: Path, *overrides: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "jaxrl_async.train", *SMALL, *overrides], cwd=cwd, env=ENV,
                          capture_output=True, text=True, timeout=240)


def _tree(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


@pytest.mark.parametrize("overrides, key", [
    (["task=custom"], "task.path=None"),
    (["task=custom", "task.path=missing.jsonl"], "task.path='missing.jsonl'"),
    (["model.source=no/such/model"], "model.source='no/such/model'"),
    (["engine.speculation.when=always", "engine.speculation.method=draft", "engine.speculation.draft_model=layers:99"],
     "engine.speculation.draft_model='layers:99'"),
    (["engine.replicas=2"], "engine.replicas=2"),
])
def test_a_rejected_command_is_one_line_naming_the_key_and_leaves_nothing_behind(tmp_path, overrides, key):
    done = _train(tmp_path, *overrides)
    assert done.returncode != 0
    assert done.stderr.splitlines() == [done.stderr.strip()] and done.stderr.startswith(f"error: {key}"), done.stderr
    assert _tree(tmp_path) == set()


@pytest.mark.slow
def test_the_device_error_names_the_cpu_recipe_and_the_recipe_runs(tmp_path):
    refused = _train(tmp_path, "engine.replicas=2")
    recipe = "on CPU set XLA_FLAGS=--xla_force_host_platform_device_count=3 and engine.colocate=false"
    assert refused.stderr.strip().endswith(recipe), refused.stderr
    done = subprocess.run([sys.executable, "-m", "jaxrl_async.train", *SMALL, "engine.replicas=2",
                           "engine.colocate=false", f"hydra.run.dir={tmp_path / 'run'}"], cwd=tmp_path,
                          env={**ENV, "XLA_FLAGS": "--xla_force_host_platform_device_count=3"},
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    placement = json.loads((tmp_path / "run" / "summary.json").read_text())["placement"]
    assert placement["engine"]["replicas"] == 2 and placement["engine"]["colocate"] is False


@pytest.mark.slow
def test_resume_of_a_path_runs_there_and_makes_no_new_folder(tmp_path):
    run_dir = tmp_path / "run"
    first = _train(tmp_path, f"hydra.run.dir={run_dir}")
    assert first.returncode == 0, first.stderr[-3000:]
    (run_dir / "summary.json").unlink()  # what a kill after the final checkpoint leaves
    before = _tree(tmp_path)
    resumed = _train(tmp_path, "resume=run")  # relative, as a user types it
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert _tree(tmp_path) == before | {"run/summary.json"}  # no outputs/train/DATE/
