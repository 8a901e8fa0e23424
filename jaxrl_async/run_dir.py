"""Who owns a run directory, and what a restart without a checkpoint does with its old files.

A run directory holds one run (docs/fault_tolerance.md): its ledger, metrics, checkpoints. Two
processes writing one of them interleave their lines and break both runs' proofs, so process 0
of a run takes an exclusive `fcntl.flock` on `run_dir/run.lock` before it touches anything and
holds it until the run ends; the kernel releases it when the process dies, however it dies (a
SIGKILL leaves no stale lock). The file keeps the owner's pid and host for the refusal message.
`check_free` asks the same question without taking the lock or creating the file, so that the
command can refuse a second run before Hydra writes its `.hydra/` files into the first run's
directory (planner/tools/entry.py `Command.check_run_dir`).

A resume asked for when the run never saved a checkpoint (killed before its first save) starts
afresh: `set_aside` moves the earlier attempt's files into `run_dir/attempts/N/` (N = 1, 2, ...)
so that nothing is lost and the new run's ledger starts empty.
"""

from __future__ import annotations

import fcntl
import os
import socket
from pathlib import Path
from typing import IO

LOCK_FILE = "run.lock"
ATTEMPTS_DIR = "attempts"
# What a run writes into its directory (Hydra's `.hydra/` and the lock stay where they are).
RUN_FILES = ("ledger.jsonl", "metrics.jsonl", "trace.jsonl", "summary.json", "policy_events.jsonl", "checkpoints", "tb", "hf")


class RunDirLock:
    """An exclusive lock on `run_dir`, held from `acquire` until `release` (or the process's end)."""

    def __init__(self, run_dir: str | Path) -> None:
        self.path = Path(run_dir) / LOCK_FILE
        self._fh: IO[str] | None = None

    def acquire(self) -> None:
        """Take the lock, or raise a one-line ValueError naming the directory and its owner."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fh = open(self.path, "a+", encoding="utf-8")
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.close()
            raise self._in_use() from None
        fh.truncate(0)
        fh.write(f"pid {os.getpid()} on {socket.gethostname()}\n")
        fh.flush()
        self._fh = fh

    def check_free(self) -> None:
        """The ValueError of `acquire` when another process holds the lock now; writes nothing (a
        directory without the file is free)."""
        try:
            fh = open(self.path, encoding="utf-8")
        except FileNotFoundError:
            return
        with fh:
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise self._in_use() from None
            fcntl.flock(fh, fcntl.LOCK_UN)

    def _in_use(self) -> ValueError:
        try:
            owner = self.path.read_text(encoding="utf-8").strip()
        except OSError:
            owner = ""
        return ValueError(f"hydra.run.dir={self.path.parent}: in use by another run "
                          f"({owner or 'a process that has not written its pid yet'}); wait for it to end or "
                          "choose another hydra.run.dir")

    def release(self) -> None:
        if self._fh is not None:
            fcntl.flock(self._fh, fcntl.LOCK_UN)
            self._fh.close()
            self._fh = None


def set_aside(run_dir: str | Path) -> Path | None:
    """Move the run files of `run_dir` into a new `run_dir/attempts/N/`; returns it (None when there
    was nothing to move)."""
    run_dir = Path(run_dir)
    present = [run_dir / name for name in RUN_FILES if (run_dir / name).exists()]
    if not present:
        return None
    attempts = run_dir / ATTEMPTS_DIR
    attempts.mkdir(exist_ok=True)
    n = 1 + max((int(p.name) for p in attempts.iterdir() if p.name.isdigit()), default=0)
    target = attempts / str(n)
    target.mkdir()
    for path in present:
        path.rename(target / path.name)
    return target
