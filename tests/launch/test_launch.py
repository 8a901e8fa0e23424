"""`python -m launch <target> --dry-run` prints exactly the commands each target would run."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from launch.launch import TARGETS, commands, main
from tests.helpers import REPO


def _dry(capsys, *argv: str) -> list[str]:
    assert main([*argv[:1], "--dry-run", *argv[1:]]) == 0
    return capsys.readouterr().out.splitlines()


def test_local_runs_the_train_module_with_the_overrides(capsys):
    assert _dry(capsys, "local", "steps=3", "engine=jax") == ["python -m jaxrl_async.train steps=3 engine=jax"]


def test_multiprocess_starts_one_process_per_rank_with_a_shared_coordinator(capsys):
    assert _dry(capsys, "multiprocess", "--nproc", "2", "--port", "9100", "hydra.run.dir=runs/a", "steps=3") == [
        f"JAXRL_COORDINATOR_ADDRESS=127.0.0.1:9100 JAXRL_NUM_PROCESSES=2 JAXRL_PROCESS_ID={i} "
        "python -m jaxrl_async.train hydra.run.dir=runs/a steps=3" for i in range(2)]


def test_processes_of_one_job_share_one_pinned_run_dir(capsys):
    lines = _dry(capsys, "multiprocess", "--nproc", "3", "steps=3")
    dirs = {[a for a in line.split() if a.startswith("hydra.run.dir=")][0] for line in lines}
    assert len(lines) == 3 and len(dirs) == 1 and dirs.pop().startswith("hydra.run.dir=outputs/train/multiprocess-")


def _sleeper(code: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", code])


def test_a_failed_process_ends_the_job_with_its_status_instead_of_leaving_the_rest_waiting():
    from launch.launch import supervise

    waiting = [_sleeper("import time; time.sleep(60)"), _sleeper("import time; time.sleep(60)")]
    failing = _sleeper("import sys, time; time.sleep(0.5); sys.exit(3)")
    started = time.monotonic()
    assert supervise([waiting[0], failing, waiting[1]], grace_s=5) == 3
    assert time.monotonic() - started < 20
    assert all(p.poll() is not None for p in waiting)


def test_a_process_that_ignores_sigterm_is_killed_after_the_grace_period():
    from launch.launch import supervise

    stubborn = _sleeper("import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)")
    failing = _sleeper("import sys, time; time.sleep(0.5); sys.exit(2)")
    started = time.monotonic()
    assert supervise([stubborn, failing], grace_s=1) == 2
    assert stubborn.poll() == -9 and time.monotonic() - started < 20


def test_a_job_process_0_stopped_on_a_signal_waits_for_the_others_and_exits_with_its_status():
    from launch.launch import supervise

    # Process 0 checkpointed and exited 143; the follower it told to stop ends by itself, later.
    stopped = _sleeper("import sys; sys.exit(143)")
    follower = _sleeper("import time; time.sleep(1.0)")
    assert supervise([stopped, follower], grace_s=30) == 143
    assert follower.returncode == 0  # not terminated as after a failure


def test_a_job_whose_processes_all_succeed_exits_zero():
    from launch.launch import supervise

    assert supervise([_sleeper("pass"), _sleeper("import time; time.sleep(0.3)")], grace_s=1) == 0


def test_ray_submits_a_job_that_selects_cluster_ray(capsys):
    assert _dry(capsys, "ray", "--address", "http://head:8265", "engine=vllm") == [
        "ray job submit --address=http://head:8265 --working-dir=. -- "
        "python -m jaxrl_async.train cluster=ray engine=vllm"]


def test_slurm_goes_through_hydras_submitit_launcher(capsys):
    assert _dry(capsys, "slurm", "--nodes", "2", "--tasks-per-node", "8", "--gpus-per-node", "8",
                "--partition", "gpu", "steps=100") == [
        "python -m jaxrl_async.train --multirun hydra/launcher=slurm hydra.launcher.nodes=2 "
        "hydra.launcher.tasks_per_node=8 hydra.launcher.gpus_per_node=8 hydra.launcher.timeout_min=240 "
        "hydra.launcher.partition=gpu steps=100"]


def test_sbatch_uses_the_template_with_the_overrides_after_it(capsys):
    assert _dry(capsys, "sbatch", "--nodes", "2", "steps=100") == [
        "sbatch --nodes=2 --ntasks-per-node=1 --gpus-per-node=1 --time=240 launch/slurm/train.sbatch steps=100"]
    assert (REPO / "launch/slurm/train.sbatch").exists()


def test_tpu_runs_the_same_command_on_every_pod_worker(capsys):
    assert _dry(capsys, "tpu", "--tpu-name", "pod", "--zone", "us-central2-b", "hydra.run.dir=/gcs/r", "steps=5") == [
        "gcloud compute tpus tpu-vm ssh pod --zone=us-central2-b --worker=all "
        "'--command=cd jaxrl-async && JAXRL_DISTRIBUTED_MODE=tpu python -m jaxrl_async.train "
        "hydra.run.dir=/gcs/r steps=5'"]


def test_every_target_has_a_dry_run_test():
    tested = {"local", "multiprocess", "ray", "slurm", "sbatch", "tpu"}
    assert set(TARGETS) == tested


def test_an_unknown_option_is_a_one_line_error():
    with pytest.raises(ValueError, match=r"unknown option --nodez=2 for target sbatch \(did you mean --nodes\?"):
        commands(["sbatch", "--dry-run", "--nodez=2"])
    with pytest.raises(ValueError, match=r"^--tpu-name and --zone: required for target tpu"):
        commands(["tpu", "--dry-run"])


@pytest.mark.parametrize(("args", "first"), [
    (["tpu", "--dry-run"], "error: --tpu-name and --zone: required for target tpu"),
    (["tpu", "--dry-run", "--zone=z"], "error: --tpu-name: required for target tpu"),
    (["multiprocess", "--nprocs=2", "--dry-run"], "error: unknown option --nprocs=2 for target multiprocess (did you mean --nproc"),
    (["multiprocess", "--nproc", "abc"], "error: argument --nproc: invalid int value: 'abc'"),
])
def test_bad_options_are_one_line_on_stderr_with_a_non_zero_status(args, first):
    p = subprocess.run([sys.executable, "-m", "launch", *args], cwd=REPO, capture_output=True, text=True)
    assert p.returncode in (1, 2) and p.stdout == ""
    assert p.stderr.startswith(first) and p.stderr.count("\n") == 1, p.stderr


def test_the_module_entry_point_prints_the_same_commands():
    out = subprocess.run([sys.executable, "-m", "launch", "local", "--dry-run", "steps=2"], cwd=REPO,
                         capture_output=True, text=True, check=True).stdout
    assert out == "python -m jaxrl_async.train steps=2\n"
