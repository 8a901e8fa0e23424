"""Real `python -m jaxrl_async.train` runs that are killed, interrupted or raced (docs/fault_tolerance.md):
a SIGKILL anywhere loses nothing a resume cannot redo, Ctrl-C checkpoints, a run directory has one
owner, and disk failures are one line."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from planner.audit import audit
from tests.helpers.cli_runs import (
    finished_checkpoints, launch, lines, saving_checkpoints, trained_prompts, trained_steps, untrained_admits,
    wait_until)

STEPS, ETA = 16, 1
# One group decodes at a time (4 slots, 4 samples) and completions are long: generation, not the
# train step, is the bottleneck, so groups are still generating at every step end and kills and
# checkpoints find groups in flight.
RUN = [f"steps={STEPS}", "batch_groups=2", "group_size=4", "max_new_tokens=96", "engine.num_slots=4",
       "engine.max_len=160", f"max_staleness={ETA}", "checkpoint_every=3"]


def finish(proc: subprocess.Popen, timeout_s: float = 400) -> str:
    log = proc.communicate(timeout=timeout_s)[0]
    assert proc.returncode == 0, log[-3000:]
    return log


def kill(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL


def assert_logs_durable_to_the_last_step(run_dir: Path) -> None:
    """After a kill: every metrics record's step is in the ledger (flushed first), and the steps
    the ledger trained are 0..k, each once."""
    trained = trained_steps(run_dir)
    assert trained == list(range(len(trained)))
    assert [m["step"] for m in lines(run_dir / "metrics.jsonl")] == trained[:len(lines(run_dir / "metrics.jsonl"))]
    assert len(trained) - len(lines(run_dir / "metrics.jsonl")) in (0, 1)


@pytest.mark.slow
def test_a_run_killed_at_three_points_and_resumed_trains_the_same_prompts_as_an_uninterrupted_run(tmp_path):
    reference = tmp_path / "reference"
    finish(launch(reference, *RUN))
    expected = trained_prompts(reference)
    assert sum(expected.values()) == 2 * STEPS

    run_dir = tmp_path / "killed"
    rng = random.Random(0)

    # 1. Before the first checkpoint: step 0 trained, step 1 generating, nothing saved yet.
    proc = launch(run_dir, *RUN)
    wait_until(proc, lambda: len(trained_steps(run_dir)) >= 1 and untrained_admits(run_dir),
               "step 0 was trained and step 1's groups admitted")
    kill(proc)
    assert finished_checkpoints(run_dir) == [], "the kill came after the first save: not before it"
    in_flight = untrained_admits(run_dir)
    assert in_flight, "no group was in flight at the kill"
    assert_logs_durable_to_the_last_step(run_dir)

    # A resume without a checkpoint starts afresh and keeps the killed attempt's files aside.
    proc = launch(run_dir, *RUN, "resume=true")
    # 2. While a checkpoint is being written (not the first: an older one must remain the resume point).
    wait_until(proc, lambda: any(not name.startswith("1.") for name in saving_checkpoints(run_dir)),
               "a checkpoint after step 1 was being written", poll_s=0.0005)
    kill(proc)
    torn = saving_checkpoints(run_dir)
    assert torn, "the save had finished before the kill landed"
    assert (run_dir / "attempts" / "1" / "ledger.jsonl").exists()
    in_flight = untrained_admits(run_dir)
    assert in_flight, "no group was in flight at the kill"
    assert_logs_durable_to_the_last_step(run_dir)
    resume_point = max(finished_checkpoints(run_dir))
    assert resume_point < int(torn[0].split(".")[0])

    # 3. At a random point of a later step.
    proc = launch(run_dir, *RUN, "resume=true")
    target = rng.randrange(resume_point + 2, STEPS - 5)
    wait_until(proc, lambda: len(trained_steps(run_dir)) >= target, f"step {target - 1} was trained")
    time.sleep(rng.uniform(0.0, 0.2))
    wait_until(proc, lambda: untrained_admits(run_dir), "groups were admitted and not trained")
    kill(proc)
    assert untrained_admits(run_dir), "no group was in flight at the kill"
    assert_logs_durable_to_the_last_step(run_dir)
    assert not saving_checkpoints(run_dir) or max(finished_checkpoints(run_dir)) > resume_point

    log = finish(launch(run_dir, *RUN, "resume=true"))
    report = audit(run_dir, ETA)
    assert report.ok, report.verdict()
    assert report.steps == STEPS and not report.lost and not report.trained_twice and report.groups_dropped == 0
    assert trained_prompts(run_dir) == expected, log[-2000:]
    assert report.readmissions > 0, "no resume regenerated an in-flight group"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["completed"] and summary["audit_ok"]
    assert [m["step"] for m in lines(run_dir / "metrics.jsonl")] == list(range(STEPS))
