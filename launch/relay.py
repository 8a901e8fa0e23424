"""The stderr of a job's processes, as the launcher shows it: each process's lines until another
process of the job has ended with an error, then none.

When one process of a multi-process job dies, the others fail in their next collective or in the
JAX coordination service, and print what they saw of it: a Gloo read error, the coordination
agent's fatal log with its C++ stack (20-65 lines, "This most likely indicates that another
task died"). Those lines say nothing the launcher's own line does not ("launch: process 1
exited with status -9; stopping the other 1"), so from the moment a peer has ended badly a
process's lines are kept out of the terminal; they go to `<run dir>/launch.process<N>.stderr` when
the run dir exists, and the launcher says how many there were and where (`summary`).

A peer's end is looked at with `waitid(WNOWAIT)`, which does not reap it (the supervisor does).
A killed process closes its sockets a moment before it is seen as ended, so its peers' first
lines can come before that: every line is held `HOLD_S` before it is shown, and kept out if a
peer of its process has ended badly by then.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections import deque
from pathlib import Path

HOLD_S = 0.5


def ended_badly(proc: subprocess.Popen) -> bool:
    """Whether `proc` has exited with a non-zero status or been killed (without reaping it)."""
    if proc.returncode is not None:
        return proc.returncode != 0
    try:
        info = os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:  # reaped meanwhile by the supervisor
        return proc.returncode not in (None, 0)
    return info is not None and not (info.si_code == os.CLD_EXITED and info.si_status == 0)


class StderrRelay:
    """Copies the stderr pipe of every process of `procs` to ours (see the module docstring)."""

    def __init__(self, procs: list[subprocess.Popen], run_dir: Path | None, hold_s: float = HOLD_S) -> None:
        self.procs, self.run_dir, self.hold_s = procs, run_dir, hold_s
        self.kept_out = [0] * len(procs)
        self._pending: deque[tuple[float, int, bytes]] = deque()
        self._lock = threading.Lock()
        self._files: dict[int, object] = {}
        self._readers = [threading.Thread(target=self._read, args=(i,), daemon=True) for i in range(len(procs))]
        for t in self._readers:
            t.start()
        self._done = threading.Event()
        self._shower = threading.Thread(target=self._show_loop, daemon=True)
        self._shower.start()

    def _read(self, i: int) -> None:
        for line in self.procs[i].stderr:
            with self._lock:
                self._pending.append((time.monotonic(), i, line))

    def _show_loop(self) -> None:
        while not self._done.is_set():
            self._show(time.monotonic() - self.hold_s)
            time.sleep(0.05)

    def _show(self, older_than: float) -> None:
        while True:
            with self._lock:
                if not self._pending or self._pending[0][0] > older_than:
                    return
                _, i, line = self._pending.popleft()
            if self.kept_out[i] or any(ended_badly(p) for j, p in enumerate(self.procs) if j != i):
                self.kept_out[i] += 1
                self._keep(i, line)
            else:
                sys.stderr.buffer.write(line)
                sys.stderr.buffer.flush()

    def _keep(self, i: int, line: bytes) -> None:
        if i not in self._files and self.run_dir is not None and self.run_dir.is_dir():
            self._files[i] = open(self._kept_file(i), "ab")
        if i in self._files:
            self._files[i].write(line)

    def _kept_file(self, i: int) -> Path:
        return self.run_dir / f"launch.process{i}.stderr"

    def summary(self, timeout_s: float = 5.0) -> list[str]:
        """After the job: what is left is shown (or kept out); one line for each process whose
        lines were kept out."""
        for t in self._readers:
            t.join(timeout_s)
        self._done.set()
        self._shower.join(timeout_s)
        self._show(float("inf"))
        for f in self._files.values():
            f.close()
        return [f"launch: process {i} printed {n} more lines after a peer ended"
                + (f" ({self._kept_file(i)})" if i in self._files else "")
                for i, n in enumerate(self.kept_out) if n]
