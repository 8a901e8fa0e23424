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

from planner.ledger_audit import audit
from tests.helpers.cli_runs import (
    finished_checkpoints, launch, lines, saving_checkpoints, trained_prompts, trained_steps, untrained_admits,
    wait_until)
from tests.helpers.filesystems import small_filesystem
from tests.helpers.train_runs import StepProbe

STEPS, ETA = 16, 1
# One group decodes at a time (4 slots, 4 samples), one token per engine call, and completions
# are long: generation, not the train step, is the bottleneck even on a loaded machine (where
# the train step slows down too), so groups are still generating at every step end and kills
# and checkpoints find groups in flight.
RUN = [f"steps={STEPS}", "batch_groups=2", "group_size=4", "max_new_tokens=96", "engine.num_slots=4",
       "engine.decode_steps_per_call=1", "engine.max_len=160", f"max_staleness={ETA}", "checkpoint_every=3"]


def finish(proc: subprocess.Popen, timeout_s: float = 400, status: int = 0) -> str:
    """Wait for the run; it must end with `status` (0: finished; 128 + N: stopped by signal N)."""
    log = proc.communicate(timeout=timeout_s)[0]
    assert proc.returncode == status, log[-3000:]
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


SHORT = ["steps=8", "batch_groups=2", "group_size=4", "max_new_tokens=8", "max_staleness=1"]


def error_lines(log: str) -> list[str]:
    return [line for line in log.splitlines() if line.startswith("error:")]


@pytest.mark.slow
def test_two_runs_started_at_once_on_one_dir_one_runs_and_the_other_fails_in_one_line(tmp_path):
    run_dir = tmp_path / "run"
    procs = [launch(run_dir, *SHORT) for _ in range(2)]
    logs = [p.communicate(timeout=400)[0] for p in procs]
    codes = sorted(p.returncode for p in procs)
    assert codes == [0, 1], logs
    winner, loser = (0, 1) if procs[0].returncode == 0 else (1, 0)
    assert error_lines(logs[loser]) == [
        f"error: hydra.run.dir={run_dir}: in use by another run (pid {procs[winner].pid} on {os.uname().nodename}); "
        "wait for it to end or choose another hydra.run.dir"], logs[loser]
    assert "Traceback" not in logs[loser]
    # The winner's files are its own: one run's metrics, a clean audit.
    assert [m["step"] for m in lines(run_dir / "metrics.jsonl")] == list(range(8))
    assert audit(run_dir, 1).ok


@pytest.mark.slow
def test_sigint_checkpoints_and_stops_cleanly_and_the_run_resumes(tmp_path):
    run_dir = tmp_path / "run"
    proc = launch(run_dir, *RUN)
    wait_until(proc, lambda: len(lines(run_dir / "metrics.jsonl")) >= 3, "3 steps were trained")
    proc.send_signal(signal.SIGINT)
    # 130, as a shell reports Ctrl-C: `train && eval` must not evaluate a stopped run.
    log = finish(proc, status=128 + signal.SIGINT)
    assert "Traceback" not in log and "KeyboardInterrupt" not in log
    assert "SIGINT: stopping at the next step boundary with a checkpoint" in log
    stopped = json.loads((run_dir / "summary.json").read_text())
    assert not stopped["completed"] and 3 <= stopped["steps"] < STEPS
    assert f"stopped at step {stopped['steps']}: resume with resume={run_dir}" in log
    assert max(finished_checkpoints(run_dir)) == stopped["steps"]

    finish(launch(run_dir, *RUN, "resume=true"))
    report = audit(run_dir, ETA)
    assert report.ok and report.steps == STEPS and not report.lost, report.verdict()


@pytest.mark.slow
def test_a_second_sigint_exits_at_once_and_the_last_checkpoint_resumes(tmp_path):
    run_dir = tmp_path / "run"
    proc = launch(run_dir, *RUN)
    wait_until(proc, lambda: 1 in finished_checkpoints(run_dir) and len(trained_steps(run_dir)) >= 3,
               "the first checkpoint and 3 steps")
    proc.send_signal(signal.SIGINT)
    time.sleep(0.02)  # two signals sent at once are one (the kernel does not queue them)
    proc.send_signal(signal.SIGINT)
    log = proc.communicate(timeout=60)[0]
    assert proc.returncode == 128 + signal.SIGINT, log[-3000:]
    # Mostly the second lands while the first stop waits for the step; when the stop was already
    # done, it interrupts the end of the process, also in one line.
    assert "SIGINT again: exiting now without a checkpoint" in log or error_lines(log), log[-3000:]
    assert "Traceback" not in log

    finish(launch(run_dir, *RUN, "resume=true"))
    report = audit(run_dir, ETA)
    assert report.ok and report.steps == STEPS and not report.lost and not report.trained_twice, report.verdict()


def make_unwritable(folder: Path) -> None:
    """A directory nobody may write into: chmod for a user; for root (whom modes do not stop) the
    immutable attribute."""
    if os.geteuid() == 0:
        if shutil.which("chattr") is None:
            pytest.skip("running as root without chattr: cannot make a directory read-only")
        subprocess.run(["chattr", "+i", str(folder)], check=True)
    else:
        folder.chmod(0o555)


def make_writable(folder: Path) -> None:
    if os.geteuid() == 0:
        subprocess.run(["chattr", "-i", str(folder)], check=True)
    folder.chmod(0o755)


@pytest.mark.slow
def test_a_read_only_checkpoint_dir_is_one_line_naming_it_and_the_run_resumes_once_writable(tmp_path):
    run_dir = tmp_path / "run"
    folder = run_dir / "checkpoints"
    proc = launch(run_dir, *RUN)
    wait_until(proc, lambda: 1 in finished_checkpoints(run_dir), "the first checkpoint")
    make_unwritable(folder)
    try:
        log = proc.communicate(timeout=300)[0]
    finally:
        make_writable(folder)
    assert proc.returncode == 1, log[-3000:]
    errors = error_lines(log)
    assert len(errors) == 1 and errors[0].startswith(f"error: checkpoint: cannot write {folder}: [Errno "), log
    assert "EPERM" in errors[0] or "EACCES" in errors[0]
    assert "Traceback" not in log

    finish(launch(run_dir, *RUN, "resume=true"))  # nothing lost: the step-1 checkpoint continues it
    report = audit(run_dir, ETA)
    assert report.ok and report.steps == STEPS and not report.lost, report.verdict()


@pytest.mark.slow
def test_a_full_disk_under_the_checkpoints_is_one_line_and_the_logs_stay_whole(tmp_path):
    run_dir = tmp_path / "run"
    with small_filesystem(run_dir / "checkpoints"):  # the first save (after step 1) cannot fit
        proc = launch(run_dir, *RUN)
        log = proc.communicate(timeout=300)[0]
    assert proc.returncode == 1, log[-3000:]
    errors = error_lines(log)
    assert errors == [f"error: checkpoint: cannot write {run_dir / 'checkpoints'}: [Errno 28 ENOSPC] "
                      "No space left on device"], log[-3000:]
    assert "Traceback" not in log and "Exception ignored" not in log, log[-3000:]
    assert_logs_durable_to_the_last_step(run_dir)  # what was trained before the failed save is on record
    assert trained_steps(run_dir), "no step was trained before the save"


# ---------------------------------------------------------------------------------- resume checks
@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """A 2-step run (checkpoints after step 1 and at the end) that resumes compare against."""
    from tests.helpers.train_runs import make_job

    run_dir = tmp_path_factory.mktemp("finished")
    job = make_job(run_dir, ["steps=2", "batch_groups=2", "group_size=4", "max_new_tokens=4"])
    on_disk = []  # at each metrics record: the steps the ledger file holds (no flush of ours in between)
    job.controller.sinks.insert(0, StepProbe(lambda record: on_disk.append((record["step"], trained_steps(run_dir)))))
    assert job.run()["completed"]
    return run_dir, on_disk


@pytest.mark.slow
def test_a_steps_train_event_is_on_disk_before_its_metrics_record(finished_run):
    _, on_disk = finished_run
    assert on_disk == [(0, [0]), (1, [0, 1])]


def resume_job(finished: tuple[Path, list], *overrides: str):
    from tests.helpers.train_runs import make_job

    return make_job(finished[0], ["steps=3", "batch_groups=2", "group_size=4", "max_new_tokens=4", "resume=true",
                              *overrides])


@pytest.mark.slow
def test_a_resume_with_another_model_is_one_line_naming_the_source_and_the_first_differing_array(
        finished_run, tmp_path):
    from jaxrl_async.models.config import ModelConfig
    from jaxrl_async.models.hf_weights import save_hf
    from jaxrl_async.models.loading import build_model, load_model

    cfg = ModelConfig.tiny(intermediate_size=96)
    other = save_hf(build_model(cfg), cfg, tmp_path / "other", load_model("tiny").tokenizer)
    with pytest.raises(ValueError) as info:
        resume_job(finished_run, f"model.source={other}")
    assert str(info.value) == (
        f"resume: model.source='{other}' does not fit the checkpoint: params/layers/w_down is "
        "float32[2, 128, 64] in the checkpoint; expected float32[2, 96, 64]; resume with the checkpointed run's model")


@pytest.mark.slow
def test_a_resume_that_changes_sampling_or_the_learning_rate_warns_listing_the_changes(finished_run, caplog):
    with caplog.at_level("WARNING", logger="jaxrl_async.job.resume"):
        job = resume_job(finished_run, "trainer.optim.lr=0.001", "temperature=0.7")
    job.release()
    warnings = [r.getMessage() for r in caplog.records if r.name == "jaxrl_async.job.resume"]
    assert warnings == ["resume: settings changed since the checkpoint: trainer.optim.lr: 0.005 -> 0.001; "
                        "temperature: 1.0 -> 0.7"]


@pytest.mark.slow
def test_a_resume_on_other_task_data_or_another_seed_is_refused_in_one_line(finished_run, tmp_path):
    data = tmp_path / "prompts.jsonl"
    data.write_text('{"prompt": "say a", "answer": "a"}\n')
    with pytest.raises(ValueError, match=r"^resume: the task's data \(task\.\*\) differs from the checkpointed "
                                         r"run's; resume with the same setting$"):
        resume_job(finished_run, "task=custom", f"task.path={data}")
    with pytest.raises(ValueError, match=r"^resume: seed=1 but the checkpointed run has seed=0; "):
        resume_job(finished_run, "seed=1")
    resume_job(finished_run).release()  # the lock of every refused job was given back
