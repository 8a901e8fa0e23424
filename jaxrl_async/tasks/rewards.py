"""Running reward functions so that a bad one costs a reward, never the run.

A reward function may be slow, raise, hang or return garbage (NaN, a string). The runtime scores
every trajectory through a `RewardRunner`, which turns each of those into `RewardResult(0.0,
error, kind)`: the runtime counts the error by `kind` and logs its reason, the group is still
trained (a 0.0 reward is a legal, if uninformative, GRPO signal) and the run goes on.

User reward functions are named by a dotted import path (`pkg.module:function` or
`pkg.module.function`) with the signature `(prompt_text, completion_text, answer) -> float`,
sync or async. A path that does not resolve to a callable is a start-up `ValueError`.

Sync functions run in the runner's own daemon threads, at most `max_workers` calls at once (a
call waits for a slot; its timeout counts from its start). Python cannot kill a thread, so a call
that times out is *abandoned*: its slot is freed at once, its thread is left to finish (or hang)
on its own, and being a daemon it never keeps the process from exiting — asyncio's default
executor would do both wrong: its threads are joined at exit, and a few hung calls fill it for
good. At most `max_hung` abandoned calls may still be running; beyond that the function is not
called at all — each reward scores 0.0 with a `hung_cap` error — until one of them returns, so a
function that always hangs costs bounded threads and a logged error per reward, never the run.
An async function is awaited under the timeout and cancelled at it.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import itertools
import math
import threading
from collections.abc import Callable
from dataclasses import dataclass
from numbers import Real
from typing import Any

TIMEOUT, HUNG_CAP, NOT_A_NUMBER, NOT_FINITE = "timeout", "hung_cap", "not_a_number", "not_finite"


@dataclass(frozen=True)
class RewardResult:
    value: float  # the reward; 0.0 whenever `error` is set
    error: str | None = None  # why the function's own value was not used (timeout, exception, bad value)
    kind: str | None = None  # the error's type: timeout | hung_cap | not_a_number | not_finite | exception class name


class RewardRunner:
    """Calls `fn(*args)` with a timeout; sync functions run in the runner's daemon threads, async
    ones are awaited (see the module docstring)."""

    _ids = itertools.count()

    def __init__(self, fn: Callable[..., Any], timeout_s: float, *, max_workers: int = 8, max_hung: int = 32):
        if not callable(fn):
            raise ValueError(f"RewardRunner.fn={fn!r}: must be callable")
        if not (isinstance(timeout_s, Real) and math.isfinite(timeout_s) and timeout_s > 0):
            raise ValueError(f"RewardRunner.timeout_s={timeout_s!r}: must be a finite number > 0")
        for name, value in (("max_workers", max_workers), ("max_hung", max_hung)):
            if not (isinstance(value, int) and value >= 1):
                raise ValueError(f"RewardRunner.{name}={value!r}: must be an int >= 1")
        self.fn = fn
        self.timeout_s = float(timeout_s)
        self.max_workers, self.max_hung = max_workers, max_hung
        self._is_async = inspect.iscoroutinefunction(fn)
        self._name = getattr(fn, "__qualname__", repr(fn))
        self._lock = threading.Lock()
        self._hung = 0  # abandoned calls still running
        self._slots: dict[asyncio.AbstractEventLoop, asyncio.Semaphore] = {}  # per event loop
        self._thread_name = f"reward-{next(self._ids)}"

    @property
    def hung(self) -> int:
        """Calls abandoned at their timeout that have not returned yet."""
        with self._lock:
            return self._hung

    async def __call__(self, *args: Any) -> RewardResult:
        try:
            if self._is_async:
                value = await asyncio.wait_for(self.fn(*args), self.timeout_s)
            else:
                value = await self._in_thread(args)
        except TimeoutError:
            return RewardResult(0.0, f"reward {self._name} timed out after {self.timeout_s:g}s", TIMEOUT)
        except _HungCap as e:
            return RewardResult(0.0, str(e), HUNG_CAP)
        except Exception as e:  # noqa: BLE001 -- any failure of user code is one failed reward
            return RewardResult(0.0, f"reward {self._name} raised {type(e).__name__}: {e}", type(e).__name__)
        # bool is a Real, but True as a reward is almost always a bug in the function.
        if isinstance(value, bool) or not isinstance(value, Real):
            return RewardResult(0.0, f"reward {self._name} returned {value!r}: not a number", NOT_A_NUMBER)
        if not math.isfinite(value):
            return RewardResult(0.0, f"reward {self._name} returned {value!r}: not finite", NOT_FINITE)
        return RewardResult(float(value))

    def _slots_here(self) -> asyncio.Semaphore:
        loop = asyncio.get_running_loop()
        if loop not in self._slots:  # a runner may serve several loops one after another (tests, scripts)
            self._slots = {lp: sem for lp, sem in self._slots.items() if not lp.is_closed()}
            self._slots[loop] = asyncio.Semaphore(self.max_workers)
        return self._slots[loop]

    async def _in_thread(self, args: tuple) -> Any:
        """`fn(*args)` in a daemon thread of its own, holding one of `max_workers` slots until it
        returns or times out (then it is abandoned; see the module docstring)."""
        async with self._slots_here():
            with self._lock:
                if self._hung >= self.max_hung:
                    raise _HungCap(f"reward {self._name} not called: {self._hung} earlier calls still hang past their "
                                   f"timeout (cap {self.max_hung}); it is called again once one returns")
            loop = asyncio.get_running_loop()
            done = loop.create_future()
            state = {"abandoned": False, "finished": False}  # both under self._lock

            def work() -> None:
                try:
                    outcome = (True, self.fn(*args))
                except BaseException as e:  # noqa: BLE001 -- handed to the awaiting coroutine
                    outcome = (False, e)
                with self._lock:
                    state["finished"] = True
                    if state["abandoned"]:
                        self._hung -= 1
                        return
                try:
                    loop.call_soon_threadsafe(_resolve, done, outcome)
                except RuntimeError:  # the loop closed meanwhile: nobody waits for this value
                    pass

            threading.Thread(target=work, name=self._thread_name, daemon=True).start()
            try:
                return await asyncio.wait_for(done, self.timeout_s)
            except (TimeoutError, asyncio.CancelledError):
                with self._lock:
                    if not state["finished"]:
                        state["abandoned"] = True
                        self._hung += 1
                raise


class _HungCap(Exception):
    """Too many abandoned calls still run: this one is refused (module docstring)."""


def _resolve(future: asyncio.Future, outcome: tuple[bool, Any]) -> None:
    if future.done():
        return
    ok, value = outcome
    if ok:
        future.set_result(value)
    else:
        future.set_exception(value)


def load_reward_fn(path: str) -> Callable[..., Any]:
    """`pkg.module:function` or `pkg.module.function` -> the callable; anything else raises."""
    if not isinstance(path, str) or not path:
        raise ValueError(f"reward_fn={path!r}: must be a dotted path 'module:function' or 'module.function'")
    module_name, sep, attr = path.partition(":")
    if not sep:
        module_name, _, attr = path.rpartition(".")
    if not module_name or not attr:
        raise ValueError(f"reward_fn={path!r}: must be a dotted path 'module:function' or 'module.function'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ValueError(f"reward_fn={path!r}: cannot import module {module_name!r} ({e})") from e
    fn = module
    for part in attr.split("."):
        if not hasattr(fn, part):
            raise ValueError(f"reward_fn={path!r}: module {module_name!r} has no attribute {attr!r}")
        fn = getattr(fn, part)
    if not callable(fn):
        raise ValueError(f"reward_fn={path!r}: {attr!r} is a {type(fn).__name__}, not a function")
    return fn
