"""Reward functions in worker processes that can be killed: a hung call costs one reward, never more.

Python cannot kill a thread, so a reward call that hangs in a thread holds it (and whatever it
holds) until the process ends; any cap on such abandoned threads must, once reached, either block
the run or fabricate rewards without calling the function. A process can be killed. `RewardPool`
runs a function, named by its dotted path, in up to `workers` worker processes, one call at a
time per worker, each under `timeout_s`:

- a call that returns: its value is checked like any reward (`rewards.checked`), the worker is reused;
- a call past its deadline: the worker is killed (SIGKILL) and the call scores the fallback with
  a `timeout` error; the next call that needs a worker starts a fresh one;
- a call that raises: the fallback with the exception's type as the kind; the worker is reused;
- a worker that dies mid-call (a segfault, `os._exit`): the fallback with `worker_died`.

So at most `workers` processes exist at any time, whatever the function does, and every reward
either is the function's own value or is marked as failed (`RewardResult.error`).

Workers come from the `forkserver` context: the parent runs JAX and asyncio threads, and a plain
`fork` of a threaded process may deadlock in the child; `spawn` would re-import the entry point
(`jaxrl_async.train`, hence JAX) in every worker, and a killed worker is replaced often. The
fork server is a fresh single-threaded process that preloads only `jaxrl_async.reward_worker`
(standard library only), so a worker is a cheap fork that then imports the function's module —
a heavy module costs that import in each fresh worker. Workers start lazily (a task that never
scores through the pool starts none), ignore SIGINT (Ctrl-C is the parent's to handle) and are
killed at exit. A worker's start-up does not count against a call's deadline; a worker that
cannot start within `start_timeout_s` fails that call with `worker_start`.

Simplifications: a reward function that starts processes of its own leaves them running when its
worker is killed; arguments and the return value must pickle (strings, JSON values, numbers).
"""

from __future__ import annotations

import asyncio
import atexit
import multiprocessing
import weakref
from typing import Any

from jaxrl_async import reward_worker
from jaxrl_async.reward_worker import load_reward_fn
from jaxrl_async.tasks.rewards import TIMEOUT, RewardResult, checked

WORKER_DIED, WORKER_START = "worker_died", "worker_start"
_CONTEXT = "forkserver"


class _Worker:
    """One worker process and the parent's end of its pipe."""

    def __init__(self, fn_path: str, name: str) -> None:
        ctx = multiprocessing.get_context(_CONTEXT)
        # The fork server imports only the light worker module, once; each worker is a cheap fork
        # of it that imports the function's module. Not '__main__': the entry point (JAX) has
        # nothing a worker needs.
        ctx.set_forkserver_preload([reward_worker.__name__])
        self.conn, child = ctx.Pipe()
        self.process = ctx.Process(target=reward_worker.serve, args=(child, fn_path), name=name, daemon=True)
        self.process.start()
        child.close()
        self.ready = False

    async def receive(self, timeout_s: float) -> tuple[str, Any]:
        """The worker's next message within `timeout_s` (TimeoutError), or ("eof", None) if it died."""
        loop = asyncio.get_running_loop()
        message: asyncio.Future = loop.create_future()
        fd = self.conn.fileno()

        def readable() -> None:
            loop.remove_reader(fd)
            if message.done():
                return
            try:
                message.set_result(self.conn.recv())
            except (EOFError, OSError):
                message.set_result(("eof", None))

        loop.add_reader(fd, readable)
        try:
            return await asyncio.wait_for(message, timeout_s)
        finally:
            loop.remove_reader(fd)

    def kill(self) -> None:
        """SIGKILL: a hung function may ignore or block every softer signal."""
        if self.process.is_alive():
            self.process.kill()
        self.process.join(timeout=10)
        self.conn.close()


class RewardPool:
    """`fn_path` called in killable worker processes, `timeout_s` per call (module docstring).
    Awaiting the pool never raises for the function's sake: every outcome is a `RewardResult`."""

    def __init__(self, fn_path: str, timeout_s: float, *, workers: int = 8, start_timeout_s: float = 120.0) -> None:
        load_reward_fn(fn_path)  # a bad path is a start-up error here, not a failed worker later
        if not (isinstance(workers, int) and workers >= 1):
            raise ValueError(f"RewardPool.workers={workers!r}: must be an int >= 1")
        self.fn_path, self.timeout_s, self.workers = fn_path, float(timeout_s), workers
        self.start_timeout_s = float(start_timeout_s)
        self._name = fn_path  # as the user typed it: the log names the function unambiguously
        self._idle: list[_Worker] = []
        self._all: set[_Worker] = set()
        self._slots: dict[asyncio.AbstractEventLoop, asyncio.Semaphore] = {}
        self.killed = 0  # workers killed at a deadline
        # At exit, before multiprocessing joins its daemonic children (atexit runs last-in first).
        atexit.register(_close_pool, weakref.ref(self))

    @property
    def processes(self) -> int:
        """Worker processes alive now (never more than `workers`)."""
        return sum(w.process.is_alive() for w in self._all)

    async def __call__(self, *args: Any) -> RewardResult:
        async with self._slots_here():
            worker = self._idle.pop() if self._idle else None
            if worker is None:
                worker = _Worker(self.fn_path, f"reward-{self._name}")
                self._all.add(worker)
                failed = await self._started(worker)
                if failed is not None:
                    return failed
            try:
                worker.conn.send(args)
                kind, payload = await worker.receive(self.timeout_s)
            except TimeoutError:
                self._discard(worker)
                self.killed += 1
                return RewardResult(0.0, f"reward {self._name} timed out after {self.timeout_s:g}s "
                                         "(its worker process was killed)", TIMEOUT)
            except BaseException:  # cancelled (the run ends) or a broken pipe: the worker's state is unknown
                self._discard(worker)
                raise
            if kind == "eof":
                self._discard(worker)
                code = worker.process.exitcode
                return RewardResult(0.0, f"reward {self._name}: its worker process died (exit code {code})",
                                    WORKER_DIED)
            self._idle.append(worker)
            if kind == "raised":
                name, text = payload
                return RewardResult(0.0, f"reward {self._name} raised {name}: {text}", name)
            return checked(self._name, payload)

    async def _started(self, worker: _Worker) -> RewardResult | None:
        """Wait for a fresh worker's ready message; a failure result if it does not come."""
        try:
            kind, payload = await worker.receive(self.start_timeout_s)
        except TimeoutError:
            kind, payload = "start_error", f"not ready after {self.start_timeout_s:g}s"
        except BaseException:
            self._discard(worker)
            raise
        if kind == "ready":
            worker.ready = True
            return None
        self._discard(worker)
        reason = payload if kind == "start_error" else "it exited while starting"
        return RewardResult(0.0, f"reward {self._name}: a worker process could not start ({reason})", WORKER_START)

    def _discard(self, worker: _Worker) -> None:
        worker.kill()
        self._all.discard(worker)

    def _slots_here(self) -> asyncio.Semaphore:
        loop = asyncio.get_running_loop()
        if loop not in self._slots:  # a pool may serve several loops one after another (train, then eval)
            self._slots = {lp: sem for lp, sem in self._slots.items() if not lp.is_closed()}
            self._slots[loop] = asyncio.Semaphore(self.workers)
        return self._slots[loop]

    def close(self) -> None:
        """Kill every worker (idle ones hold nothing, so there is nothing to wait for)."""
        for worker in list(self._all):
            self._discard(worker)
        self._idle.clear()


def _close_pool(ref: weakref.ref) -> None:
    pool = ref()
    if pool is not None:
        pool.close()
