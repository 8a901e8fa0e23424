"""A run directory's owner lock and the setting aside of an attempt that never saved a checkpoint."""

import os
import socket
import subprocess
import sys

import pytest

from jaxrl_async.run_dir import RunDirLock, set_aside


def test_a_second_owner_is_refused_with_the_dir_and_the_first_owners_pid(tmp_path):
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from jaxrl_async.run_dir import RunDirLock; "
         f"lock = RunDirLock({str(tmp_path)!r}); lock.acquire(); print('held', flush=True); time.sleep(60)"],
        stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": os.getcwd()})
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(ValueError) as info:
            RunDirLock(tmp_path).acquire()
        assert str(info.value) == (f"hydra.run.dir={tmp_path}: in use by another run (pid {holder.pid} on "
                                   f"{socket.gethostname()}); wait for it to end or choose another hydra.run.dir")
    finally:
        holder.kill()
        holder.wait()
    lock = RunDirLock(tmp_path)  # a killed owner leaves no stale lock: the kernel released it
    lock.acquire()
    lock.release()


def test_a_released_lock_can_be_taken_again_in_the_same_process(tmp_path):
    first = RunDirLock(tmp_path)
    first.acquire()
    with pytest.raises(ValueError, match="in use by another run"):
        RunDirLock(tmp_path).acquire()
    first.release()
    RunDirLock(tmp_path).acquire()


def test_set_aside_moves_the_run_files_into_numbered_attempts(tmp_path):
    assert set_aside(tmp_path) is None  # nothing to move
    for attempt in (1, 2):
        (tmp_path / "ledger.jsonl").write_text(f"attempt {attempt}\n")
        (tmp_path / "checkpoints" / "1.orbax-checkpoint-tmp").mkdir(parents=True)
        (tmp_path / ".hydra").mkdir(exist_ok=True)
        assert set_aside(tmp_path) == tmp_path / "attempts" / str(attempt)
    assert (tmp_path / "attempts" / "2" / "ledger.jsonl").read_text() == "attempt 2\n"
    assert (tmp_path / "attempts" / "1" / "checkpoints" / "1.orbax-checkpoint-tmp").is_dir()
    assert not (tmp_path / "ledger.jsonl").exists() and (tmp_path / ".hydra").is_dir()
