"""`python -m jaxrl_async.train` with a sharded trainer and replicated engines, in one process and
as one job over two processes: the same run as on one device, one set of run files, audit clean.

The runs use η=0: every batch is generated on the weights of the step that trains it, so the
sequence of batches does not depend on timing, and a sharded run must reproduce the one-device
run's losses and parameters up to float reassociation (sharded matmuls sum in another order).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file

from tests.helpers import REPO
from tests.helpers.train_runs import QUIET, make_job, read_jsonl
SYNC = ["max_staleness=0", "batch_groups=4", "group_size=4", "max_new_tokens=4", "seed=3"]
# Sharded and unsharded runs differ by float reassociation only; 10 steps of Adam amplify a
# 1e-7 logit difference to about 1e-5 in the weights.
PARAM_ATOL = 2e-4


def _audit(run_dir: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "planner.audit", str(run_dir), "--max-staleness", "0"],
                          cwd=REPO, capture_output=True, text=True, timeout=120)


def _params(run_dir: Path) -> dict[str, np.ndarray]:
    return load_file(run_dir / "hf" / "model.safetensors")


def _assert_same_run(one: Path, other: Path) -> None:
    a, b = read_jsonl(one / "metrics.jsonl"), read_jsonl(other / "metrics.jsonl")
    assert [r["step"] for r in a] == [r["step"] for r in b] and len(a) >= 10
    for key in ("loss", "train/grad_norm", "train/entropy"):
        np.testing.assert_allclose([r[key] for r in b], [r[key] for r in a], rtol=1e-3, atol=1e-4, err_msg=key)
    np.testing.assert_allclose([r["reward_mean"] for r in b], [r["reward_mean"] for r in a], atol=1e-6)
    # Non-trivial: some steps had a gradient (rewards varied within a group), so equal
    # parameters are not two copies of the init moved only by weight decay.
    assert sum(r["train/grad_norm"] > 1e-3 for r in a) >= 2
    pa, pb = _params(one), _params(other)
    assert sorted(pa) == sorted(pb)
    moved = max(float(np.abs(pa[k] - pb[k]).max()) for k in pa)
    for key in pa:
        np.testing.assert_allclose(pb[key], pa[key], atol=PARAM_ATOL, err_msg=key)
    assert moved < PARAM_ATOL


@pytest.fixture(scope="module")
def one_device_run(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("one_device") / "run"
    job = make_job(run_dir, SYNC + ["steps=10", "export_hf=true"])
    assert job.run()["audit_ok"]
    return run_dir


@pytest.mark.slow
def test_fsdp_by_tensor_trainer_and_two_engine_replicas_follow_the_one_device_run(one_device_run, tmp_path):
    run_dir = tmp_path / "sharded"
    job = make_job(run_dir, SYNC + ["steps=10", "export_hf=true", "trainer.mesh.fsdp=2", "trainer.mesh.tensor=2",
                                    "engine.replicas=2"])
    out = job.run()
    assert out["audit_ok"], out["audit_verdict"]
    assert out["placement"] == {
        "processes": 1, "trainer": {"devices": 4, "mesh": {"data": 1, "fsdp": 2, "tensor": 2}},
        "engine": {"devices": 2, "replicas": 2, "tensor_parallel": 1, "colocate": True, "backend": "jax"}}
    assert out["weight_push_s_mean"] > 0
    _assert_same_run(one_device_run, run_dir)


def test_a_batch_whose_rows_do_not_divide_the_data_axes_is_padded_to_them(tmp_path):
    """2 groups x 3 samples = 6 rows on data=4: the controller pads to the trainer's multiple."""
    job = make_job(tmp_path / "run", ["batch_groups=2", "group_size=3", "steps=2", "max_new_tokens=4",
                                      "trainer.mesh.data=4"])
    out = job.run()
    assert out["audit_ok"] and out["steps"] == 2 and out["placement"]["trainer"]["devices"] == 4


# --------------------------------------------------------------------- one job over two processes


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch(run_dir: Path, *overrides: str, devices_per_process: int = 2, nproc: int = 2,
            grace_s: int = 20) -> subprocess.Popen:
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONUNBUFFERED": "1",
           "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices_per_process}"}
    return subprocess.Popen(
        [sys.executable, "-m", "launch", "multiprocess", "--nproc", str(nproc), "--port", str(_free_port()),
         "--grace-s", str(grace_s), *QUIET, *SYNC, "trainer.mesh.data=2", "trainer.mesh.fsdp=2",
         f"hydra.run.dir={run_dir}", *overrides],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _wait_for_steps(proc: subprocess.Popen, metrics: Path, steps: int) -> None:
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None:
        if metrics.exists() and len(read_jsonl(metrics)) >= steps:
            return
        time.sleep(0.2)
    raise AssertionError(f"no {steps} steps: " + (proc.communicate()[0][-3000:] if proc.poll() is not None else "timeout"))


def _run_files(root: Path) -> list[Path]:
    return sorted(p.relative_to(root) for p in root.rglob("*") if p.name in ("ledger.jsonl", "metrics.jsonl"))


@pytest.mark.slow
@pytest.mark.xdist_group("multiprocess")  # one worker runs both jobs: each is 2 processes on 2 cores
def test_two_processes_run_one_job_that_equals_the_one_process_four_device_run(tmp_path):
    single = tmp_path / "single"
    proc = _launch(single, "steps=10", "export_hf=true", devices_per_process=4, nproc=1)
    log = proc.communicate(timeout=300)[0]
    assert proc.returncode == 0, log[-3000:]
    run_dir = tmp_path / "job"
    proc = _launch(run_dir, "steps=10", "export_hf=true")
    log = proc.communicate(timeout=400)[0]
    assert proc.returncode == 0, log[-3000:]
    assert _run_files(tmp_path) == [Path("job/ledger.jsonl"), Path("job/metrics.jsonl"),
                                    Path("single/ledger.jsonl"), Path("single/metrics.jsonl")]
    assert log.count("audit PASS") == 1, log[-3000:]  # one controller printed one report
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["placement"]["processes"] == 2 and summary["placement"]["trainer"]["devices"] == 4
    audit = _audit(run_dir)
    assert audit.returncode == 0, audit.stdout + audit.stderr
    _assert_same_run(single, run_dir)


@pytest.mark.slow
@pytest.mark.xdist_group("multiprocess")
def test_a_sigterm_to_the_job_checkpoints_and_both_processes_resume_it(tmp_path):
    run_dir = tmp_path / "job"
    proc = _launch(run_dir, "steps=12")
    metrics = run_dir / "metrics.jsonl"
    _wait_for_steps(proc, metrics, 3)
    proc.send_signal(signal.SIGTERM)
    log = proc.communicate(timeout=120)[0]
    # The launcher's status is process 0's (stopped by SIGTERM); the follower ends on its own.
    assert proc.returncode == 128 + signal.SIGTERM, log[-3000:]
    assert "launch: process" not in log, log[-3000:]
    stopped = json.loads((run_dir / "summary.json").read_text())
    assert not stopped["completed"] and 3 <= stopped["steps"] < 12, stopped
    saved = sorted(int(p.name) for p in (run_dir / "checkpoints").iterdir() if p.name.isdigit())
    assert saved == [1, stopped["steps"]]  # the save after step 1, and the stop's

    proc = _launch(run_dir, "steps=12", "resume=true")
    log = proc.communicate(timeout=400)[0]
    assert proc.returncode == 0, log[-3000:]
    done = json.loads((run_dir / "summary.json").read_text())
    assert done["completed"] and done["steps"] == 12 and done["audit_ok"], done
    assert [r["step"] for r in read_jsonl(metrics)] == list(range(12))
    audit = _audit(run_dir)
    assert audit.returncode == 0, audit.stdout + audit.stderr


@pytest.mark.slow
@pytest.mark.xdist_group("multiprocess")
def test_a_killed_follower_ends_the_job_without_a_hang_and_the_last_checkpoint_resumes(tmp_path):
    run_dir = tmp_path / "job"
    proc = _launch(run_dir, "steps=10", "checkpoint_every=2", grace_s=5)
    metrics = run_dir / "metrics.jsonl"
    _wait_for_steps(proc, metrics, 5)
    # The save after step 4 is asynchronous: kill once it is finished (orbax renames its tmp
    # folder to "4" at the end), so that the resume point does not depend on the machine's load.
    deadline = time.monotonic() + 120
    while not (run_dir / "checkpoints" / "4").is_dir() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.05)
    children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
    follower = next(int(c) for c in children
                    if b"JAXRL_PROCESS_ID=1\0" in Path(f"/proc/{c}/environ").read_bytes() + b"\0")
    killed_at = time.monotonic()
    os.kill(follower, signal.SIGKILL)
    log = proc.communicate(timeout=120)[0]
    assert proc.returncode == 137, log[-3000:]  # the dead process's status: killed by signal 9
    assert "launch: process 1 exited with status -9; stopping the other 1" in log
    assert time.monotonic() - killed_at < 60  # no hang: the launcher ended process 0 too
    saved = [int(p.name) for p in (run_dir / "checkpoints").iterdir() if p.name.isdigit()]
    assert saved and max(saved) >= 4

    proc = _launch(run_dir, "steps=10", "resume=true")
    log = proc.communicate(timeout=400)[0]
    assert proc.returncode == 0, log[-3000:]
    done = json.loads((run_dir / "summary.json").read_text())
    assert done["completed"] and done["steps"] == 10 and done["audit_ok"], done
    assert [r["step"] for r in read_jsonl(metrics)] == list(range(10))
