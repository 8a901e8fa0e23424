"""Checkpoint faults, as an operator meets them: `python -m jaxrl_async.train` runs whose newest
checkpoints are damaged, that are SIGKILLed while a checkpoint is written, or that are killed after
their final checkpoint — then `resume=true` (jaxrl_async/checkpoint.py, jaxrl_async/job/resume.py).

Each case asserts what the operator sees: the exit status, at most 2 lines about the damage, and
for a resumed run that `python -m planner.audit` passes on its ledger and that it trained the same
multiset of prompts as the uninterrupted run of the same seed (every admitted prompt once). One
base run per module is copied for each case, so the module costs a handful of tiny-model runs.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from jaxrl_async.checkpoint import MANIFEST_FILE
from tests.helpers import REPO
from tests.helpers.cli_runs import ORBAX_TMP, trained_prompts, trained_steps, wait_until
from tests.helpers.train_runs import QUIET

pytestmark = pytest.mark.slow

STEPS = 4
# Checkpoints after step 1, step 2 and at the end (4), all kept: two can be damaged and one remain.
RUN = [f"steps={STEPS}", "batch_groups=2", "group_size=2", "max_new_tokens=4", "max_staleness=1",
       "checkpoint_every=2", "keep_checkpoints=3", "export_hf=true", "progress=plain"]
ENV = {**os.environ, "JAX_PLATFORMS": "cpu", "HYDRA_FULL_ERROR": "0"}


def command(run_dir: Path, *overrides: str) -> list[str]:
    quiet = [o for o in QUIET if o.split("=", 1)[0] not in {r.split("=", 1)[0] for r in RUN}]
    return [sys.executable, "-m", "jaxrl_async.train", *quiet, *RUN, f"hydra.run.dir={run_dir}", *overrides]


def train(run_dir: Path, *overrides: str) -> subprocess.CompletedProcess:
    return subprocess.run(command(run_dir, *overrides), cwd=REPO, env=ENV, capture_output=True, text=True,
                          timeout=240)


def audit_passes(run_dir: Path) -> bool:
    done = subprocess.run([sys.executable, "-m", "planner.audit", str(run_dir)], cwd=REPO, env=ENV,
                          capture_output=True, text=True, timeout=120)
    return done.returncode == 0


def damage_lines(done: subprocess.CompletedProcess) -> list[str]:
    return [line for line in (done.stdout + done.stderr).splitlines() if " is damaged (" in line]


def largest_data_file(step_dir: Path) -> Path:
    return max((p for p in (step_dir / "trainer").rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    """An uninterrupted run: checkpoints 1, 2 and 4, summary.json, hf/."""
    run_dir = tmp_path_factory.mktemp("base") / "run"
    done = train(run_dir)
    assert done.returncode == 0, done.stderr[-3000:]
    assert sorted(int(p.name) for p in (run_dir / "checkpoints").iterdir()) == [1, 2, 4]
    assert sum(trained_prompts(run_dir).values()) == 2 * STEPS
    return run_dir


def copy(base: Path, tmp_path: Path) -> Path:
    shutil.copytree(base, tmp_path / "run")
    return tmp_path / "run"


def assert_finished_like(base: Path, run_dir: Path) -> None:
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["completed"] and summary["audit_ok"], summary.get("audit_verdict")
    assert (run_dir / "hf").is_dir()
    assert trained_steps(run_dir) == list(range(STEPS))
    assert trained_prompts(run_dir) == trained_prompts(base)  # every admitted prompt once, as uninterrupted
    assert audit_passes(run_dir)


def test_a_damaged_newest_checkpoint_is_one_line_and_the_run_resumes_from_an_older_one(base, tmp_path):
    run_dir = copy(base, tmp_path)
    checkpoints = run_dir / "checkpoints"
    os.truncate(largest_data_file(checkpoints / "4"), 100)  # caught by the manifest
    (checkpoints / "2" / MANIFEST_FILE).unlink()  # saved before manifests existed: its restore decides
    (checkpoints / "2" / "meta" / "metadata").write_text("garbage, not json")
    (run_dir / "summary.json").unlink()
    shutil.rmtree(run_dir / "hf")
    done = train(run_dir, "resume=true")
    assert done.returncode == 0, done.stderr[-3000:]
    lines = damage_lines(done)
    assert len(lines) == 2, lines
    assert "checkpoints/4 is damaged (trainer/" in lines[0] and "bytes, the manifest recorded" in lines[0]
    assert "checkpoints/2 is damaged (meta: " in lines[1]
    assert all(line.endswith("; resuming from checkpoints/1") for line in lines)
    assert len(done.stderr.strip().splitlines()) <= 2, done.stderr
    assert_finished_like(base, run_dir)
    # The damaged ones are kept aside; the resumed run saved steps 2 and 4 afresh.
    assert {p.name for p in checkpoints.iterdir()} >= {"1", "2", "4", "2.damaged", "4.damaged"}


def test_a_damaged_checkpoint_without_a_manifest_is_one_warning_line_naming_the_array_and_the_fault(base, tmp_path):
    run_dir = copy(base, tmp_path)
    newest = run_dir / "checkpoints" / "4"
    (newest / MANIFEST_FILE).unlink()  # killed before its manifest was written: its restore decides
    os.truncate(largest_data_file(newest), 100)  # tensorstore fails inside orbax's restore
    (run_dir / "summary.json").unlink()
    shutil.rmtree(run_dir / "hf")
    clean = train(copy(base, tmp_path / "clean"), "resume=true")  # the same resume, undamaged
    done = train(run_dir, "resume=true")
    assert done.returncode == 0, done.stderr[-3000:]
    out = (done.stdout + done.stderr).splitlines()
    (line,) = damage_lines(done)
    # The step, the item, the array and what is wrong with it; then the fallback.
    assert "checkpoints/4 is damaged (trainer: ValueError: OUT_OF_RANGE: Error reading \"" in line, line
    assert "is not valid for value of size 100)" in line and line.endswith("; resuming from checkpoints/2"), line
    assert "Traceback" not in done.stdout + done.stderr and not done.stderr.strip(), done.stderr[:2500]
    # Nothing else: the undamaged resume's lines, that warning, and the progress of the 2 steps retrained.
    assert len(out) <= len((clean.stdout + clean.stderr).splitlines()) + 1 + 2, "\n".join(out)
    assert_finished_like(base, run_dir)


def test_no_whole_checkpoint_is_one_error_line_naming_each_and_changes_nothing(base, tmp_path):
    run_dir = copy(base, tmp_path)
    for step in (1, 2, 4):
        (run_dir / "checkpoints" / str(step) / "meta" / "metadata").write_text("{")
    ledger = (run_dir / "ledger.jsonl").read_bytes()
    done = train(run_dir, "resume=true")
    assert done.returncode == 1
    errors = done.stderr.strip().splitlines()
    assert len(errors) == 1, done.stderr
    assert errors[0].startswith("error: resume: checkpoints/4 is damaged (meta/metadata: 1 bytes, the manifest recorded ")
    assert "checkpoints/2 is damaged" in errors[0] and "checkpoints/1 is damaged" in errors[0]
    assert (run_dir / "ledger.jsonl").read_bytes() == ledger
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["1", "2", "4"]


def test_a_run_killed_after_its_final_checkpoint_resumes_with_the_same_steps_into_its_summary(base, tmp_path):
    run_dir = copy(base, tmp_path)
    (run_dir / "summary.json").unlink()  # what a kill between the final save and the export leaves
    shutil.rmtree(run_dir / "hf")
    ledger = (run_dir / "ledger.jsonl").read_bytes()
    done = train(run_dir, "resume=true")
    assert done.returncode == 0, done.stderr[-3000:]
    assert (run_dir / "ledger.jsonl").read_bytes() == ledger  # no step trained, nothing admitted
    assert not done.stderr.strip(), done.stderr
    assert_finished_like(base, run_dir)


def test_a_sigkill_while_a_checkpoint_is_written_resumes_from_the_last_finished_one(base, tmp_path):
    run_dir = tmp_path / "run"
    proc = subprocess.Popen(command(run_dir), cwd=REPO, env=ENV, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    folder = run_dir / "checkpoints"

    def saving_after_the_first() -> bool:
        try:
            return any(ORBAX_TMP in name and not name.startswith("1.") for name in os.listdir(folder))
        except FileNotFoundError:
            return False

    try:
        wait_until(proc, saving_after_the_first, "a checkpoint after step 1 was being written", poll_s=0.0005)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
    assert not (run_dir / "summary.json").exists()
    done = train(run_dir, "resume=true")
    assert done.returncode == 0, done.stderr[-3000:]
    assert not damage_lines(done)
    assert_finished_like(base, run_dir)
