"""Signal a Ray generation worker at a moment that makes the fault certain, from a thread of its own.

A step-end hook (`StepProbe`) sees the workers only between steps, when a fast engine often holds
nothing: a worker stopped idle may then never be needed again before the run ends, so the test
that waits for its deadline sees nothing, and the outcome depends on the machine's speed.
`SignalOnFreshRequest` instead waits for a request that was *just* handed to a worker (a request
id that was not there one scan earlier) and signals that worker at once: the request cannot be
finished yet (its samples need many engine calls), so the run needs it, and a stopped worker is
certain to be found by its deadline. It also keeps reading what the signalled worker holds until
the proxy takes it out of service: requests routed to it after the signal (before it was
suspect) go to the fault path too.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from typing import Any


def _held(worker: Any) -> set[str]:
    """A copy of `worker.live`, which the proxy's event loop changes under this thread."""
    while True:
        try:
            return set(worker.live)
        except RuntimeError:  # changed size during the copy: read it again
            continue


class SignalOnFreshRequest:
    """Once `arm()` was called, send `sig` to the first live worker of `proxy` that was handed a new
    request (once). Afterwards: `pid`, `t` (wall time of the signal), `run_s` (`clock()` then),
    `requests` (what it held at the signal) and `held` (everything it held until it went out of
    service). A context manager: the thread ends on exit, and a stopped worker is killed."""

    def __init__(self, proxy: Any, sig: int, clock=lambda: 0.0, scan_s: float = 0.002):
        self.proxy, self.sig, self.clock, self.scan_s = proxy, sig, clock, scan_s
        self.pid: int | None = None
        self.t = self.run_s = 0.0
        self.requests: list[str] = []
        self.held: set[str] = set()
        self._worker: Any = None
        self._armed, self._done = threading.Event(), threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def arm(self) -> None:
        self._armed.set()

    def _run(self) -> None:
        seen: set[str] = set()
        while not self._done.is_set():
            if self._worker is not None:
                if not self._worker.alive:
                    return
                self.held |= _held(self._worker)
            elif self._armed.is_set():
                for worker in [w for w in self.proxy.workers if w.alive]:
                    live = _held(worker)
                    if live - seen:
                        self.requests, self.held = sorted(live), set(live)
                        self.t, self.run_s, self.pid = time.time(), self.clock(), worker.pid
                        os.kill(worker.pid, self.sig)
                        self._worker = worker
                        break
                    seen |= live
            else:
                for worker in self.proxy.workers:
                    seen |= _held(worker)
            time.sleep(self.scan_s)

    def __enter__(self) -> SignalOnFreshRequest:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._done.set()
        self._thread.join()
        if self.pid is not None:  # never leave a stopped process behind, whatever happened
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
