"""The fault matrix's one-line cases: `python -m jaxrl_async.train` (and `launch`) as an operator
runs them, each fault answered by one `error: ...` line naming the file or key, a non-zero exit
status, no traceback, within a time bound (every run is a subprocess with a timeout).

- a policy parameter of the wrong type (`policy.migrate=no`): the key, and no run dir;
- a GGUF without its vocabulary or `llama.block_count`: the file and the key;
- Ctrl-C at any moment of start-up: INTERRUPTED, exit status 130;
- a read-only run dir: the dir (before Hydra writes `.hydra/` there);
- a second run on a dir another run holds (its lock, or its files without resume): refused
  before Hydra writes, every file of the other run byte-identical;
- a full disk under the run dir: the file that hit it, the TensorBoard writer closed quietly;
- one process of a 2-process job killed: the launcher's line (and where the survivor's are), the
  job ends at once.
"""

from __future__ import annotations

import hashlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from jaxrl_async.cli.interrupt import INTERRUPTED
from jaxrl_async.run_dir import RunDirLock
from tests.helpers import REPO
from tests.helpers.filesystems import small_filesystem
from tests.helpers.gguf_files import write_metadata_gguf
from tests.helpers.train_runs import QUIET

SMALL = [*QUIET, "batch_groups=2", "group_size=2", "max_new_tokens=4"]
ENV = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONUNBUFFERED": "1"}


def _train(*overrides: str, timeout_s: float = 240) -> tuple[subprocess.CompletedProcess, float]:
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "jaxrl_async.train", *SMALL, *overrides], cwd=REPO, env=ENV,
                          capture_output=True, text=True, timeout=timeout_s)
    return done, time.monotonic() - started


def _one_error_line(stderr: str) -> str:
    """The contract: at most 2 lines on stderr, one of them `error: ...`, no traceback."""
    lines = stderr.splitlines()
    assert len(lines) <= 2 and "Traceback" not in stderr, stderr[-3000:]
    errors = [line for line in lines if line.startswith("error: ")]
    assert len(errors) == 1, stderr[-3000:]
    return errors[0]


@pytest.mark.parametrize("key", ["tokenizer.ggml.tokens", "llama.block_count"])
def test_a_gguf_without_a_required_key_is_one_line_naming_the_file_and_the_key(tmp_path, key):
    path = write_metadata_gguf(tmp_path / "m.gguf", without={key})
    done, _ = _train(f"model.source={path}", f"hydra.run.dir={tmp_path / 'run'}")
    assert done.returncode == 1
    assert _one_error_line(done.stderr) == f"error: model.source={path}: no {key} in the GGUF metadata"


@pytest.mark.parametrize(("args", "line"), [
    (["policy.migrate=no"], "error: policy.migrate='no': must be true or false"),
    (["policy=nemo_windowed", "policy.sample_freshest_first=1"],
     "error: policy.sample_freshest_first=1: must be true or false"),
])
def test_a_mistyped_policy_parameter_is_one_line_naming_it_and_leaves_no_run_dir(tmp_path, args, line):
    done, _ = _train(*args, f"hydra.run.dir={tmp_path / 'run'}")
    assert done.returncode == 1
    assert _one_error_line(done.stderr) == line
    assert not (tmp_path / "run").exists()


def _wait_until_python_handles_sigint(proc: subprocess.Popen, timeout_s: float = 60) -> None:
    """Until the interpreter has installed its SIGINT handler (/proc's SigCgt): before that the
    process is still being exec'd and loaded, and a Ctrl-C kills it as it would any program (on a
    loaded machine that can take longer than the shortest delay below)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            status = Path(f"/proc/{proc.pid}/status").read_text()
        except FileNotFoundError:
            return
        caught = next((int(line.split()[1], 16) for line in status.splitlines() if line.startswith("SigCgt:")), 0)
        if caught & (1 << (signal.SIGINT - 1)):
            return
        time.sleep(0.005)


@pytest.mark.slow
def test_ctrl_c_at_any_moment_of_start_up_is_one_line_and_exit_status_130(tmp_path):
    interrupted = 0
    for delay in (0.3, 1.0, 3.0, 6.0):
        proc = subprocess.Popen([sys.executable, "-m", "jaxrl_async.train", *SMALL, "steps=5000",
                                 f"hydra.run.dir={tmp_path / str(delay)}"], cwd=REPO, env=ENV,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        _wait_until_python_handles_sigint(proc)
        time.sleep(delay)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=240)
        assert proc.returncode == 130, err[-3000:]
        # A fast machine reached the loop: it stopped there with a checkpoint (130 too).
        if (tmp_path / str(delay) / "summary.json").exists():
            continue
        assert err.splitlines() == [INTERRUPTED], err[-3000:]
        interrupted += 1
    assert interrupted >= 2  # non-trivial: most delays land in the start-up


def test_a_read_only_run_dir_is_one_line_naming_it(tmp_path):
    with small_filesystem(tmp_path / "ro", read_only=True) as mount:
        done, _ = _train(f"hydra.run.dir={mount / 'run'}")
    assert done.returncode == 1
    line = _one_error_line(done.stderr)
    assert line.startswith(f"error: hydra.run.dir={mount / 'run'}: cannot write there") and "read-only" in line


def _first_run(run_dir: Path) -> dict[str, str]:
    """The files another run left (its Hydra config, ledger, metrics, lock); their checksums."""
    (run_dir / ".hydra").mkdir(parents=True)
    (run_dir / ".hydra" / "config.yaml").write_text("steps: 7\n")
    (run_dir / "ledger.jsonl").write_text('{"event": "admit", "uid": 0}\n')
    (run_dir / "metrics.jsonl").write_text('{"step": 0}\n')
    (run_dir / "train.log").write_text("")
    return _checksums(run_dir)


def _checksums(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.rglob("*"))
            if p.is_file()}


@pytest.mark.parametrize("resume", [False, True])
def test_a_second_run_on_a_locked_dir_is_refused_and_leaves_the_other_run_s_files_untouched(tmp_path, resume):
    run_dir = tmp_path / "run"
    _first_run(run_dir)
    lock = RunDirLock(run_dir)
    lock.acquire()  # this process is the other run
    try:
        before = _checksums(run_dir)
        done, _ = _train(f"hydra.run.dir={run_dir}", *(["resume=true"] if resume else []))
        after = _checksums(run_dir)
    finally:
        lock.release()
    assert done.returncode == 1
    assert _one_error_line(done.stderr) == (
        f"error: hydra.run.dir={run_dir}: in use by another run (pid {os.getpid()} on {socket.gethostname()}); "
        "wait for it to end or choose another hydra.run.dir")
    assert after == before and ".hydra/config.yaml" in after


def test_a_second_run_on_a_finished_run_s_dir_without_resume_is_refused_before_hydra_writes(tmp_path):
    run_dir = tmp_path / "run"
    before = _first_run(run_dir)
    done, _ = _train(f"hydra.run.dir={run_dir}")
    assert done.returncode == 1
    assert "already holds a run; pass resume=true" in _one_error_line(done.stderr)
    assert _checksums(run_dir) == before


@pytest.mark.slow
def test_a_full_disk_under_the_run_dir_is_one_line_naming_the_file_and_no_writer_traceback(tmp_path):
    with small_filesystem(tmp_path / "small", "96k") as mount:
        # checkpoint_every=0: no save before the end, so one of the logs fills the disk first.
        done, elapsed = _train("steps=500", "checkpoint_every=0", "tensorboard=true", f"hydra.run.dir={mount / 'run'}")
    assert done.returncode == 1, done.stderr[-3000:]
    line = _one_error_line(done.stderr)
    assert line.startswith("error: [Errno 28] No space left on device: ") and str(mount / "run") in line, line
    assert elapsed < 240


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
@pytest.mark.xdist_group("multiprocess")
@pytest.mark.parametrize("killed", [1, 0])
def test_one_killed_process_of_a_2_process_job_leaves_the_survivor_silent_and_ends_the_job_at_once(tmp_path, killed):
    run_dir = tmp_path / "job"
    env = {**ENV, "XLA_FLAGS": "--xla_force_host_platform_device_count=1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "launch", "multiprocess", "--nproc", "2", "--port", str(_free_port()), "--grace-s", "5",
         *SMALL, "max_staleness=0", "steps=200", "trainer.mesh.data=2", f"hydra.run.dir={run_dir}"],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    metrics, deadline = run_dir / "metrics.jsonl", time.monotonic() + 240
    while proc.poll() is None and time.monotonic() < deadline and not (
            metrics.exists() and len(metrics.read_text().splitlines()) >= 2):
        time.sleep(0.2)
    assert proc.poll() is None, proc.communicate()[1][-3000:]
    children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
    victim = next(int(c) for c in children
                  if f"JAXRL_PROCESS_ID={killed}\0".encode() in Path(f"/proc/{c}/environ").read_bytes())
    killed_at = time.monotonic()
    os.kill(victim, signal.SIGKILL)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 137
    assert time.monotonic() - killed_at < 25  # at worst the launcher's grace (5 s) after its SIGTERM
    lines = err.splitlines()
    assert len(lines) <= 2 and "Traceback" not in err, err[-3000:]
    # "; stopping the other 1" unless the survivor had already ended by itself.
    assert lines[0].startswith(f"launch: process {killed} exited with status -9"), err[-3000:]
    # What the survivor printed after its peer's death is kept, out of the terminal.
    kept = run_dir / f"launch.process{1 - killed}.stderr"
    assert lines[1:] in ([], [f"launch: process {1 - killed} printed {len(kept.read_text().splitlines())} more lines "
                              f"after a peer ended ({kept})"]), err[-3000:]
