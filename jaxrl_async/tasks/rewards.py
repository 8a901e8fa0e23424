"""Running reward functions so that a bad one costs a reward, never the run.

A reward function may be slow, raise, hang or return garbage (NaN, a string). The runtime scores
every trajectory through a `RewardRunner`, which turns each of those into `RewardResult(0.0,
error)`: the runtime counts and logs the error, the group is still trained (a 0.0 reward is a
legal, if uninformative, GRPO signal) and the run goes on.

User reward functions are named by a dotted import path (`pkg.module:function` or
`pkg.module.function`) with the signature `(prompt_text, completion_text, answer) -> float`,
sync or async. A path that does not resolve to a callable is a start-up `ValueError`.

Limitation, on purpose: a sync function runs in a worker thread (`asyncio.to_thread`), and
Python cannot kill a thread, so a timed-out sync function keeps its thread until it returns;
only its result is discarded. Run rewards that can hang forever in a subprocess of your own.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import math
from collections.abc import Callable
from dataclasses import dataclass
from numbers import Real
from typing import Any


@dataclass(frozen=True)
class RewardResult:
    value: float  # the reward; 0.0 whenever `error` is set
    error: str | None = None  # why the function's own value was not used (timeout, exception, bad value)


class RewardRunner:
    """Calls `fn(*args)` with a timeout; sync functions run in a thread, async ones are awaited."""

    def __init__(self, fn: Callable[..., Any], timeout_s: float):
        if not callable(fn):
            raise ValueError(f"RewardRunner.fn={fn!r}: must be callable")
        if not (isinstance(timeout_s, Real) and math.isfinite(timeout_s) and timeout_s > 0):
            raise ValueError(f"RewardRunner.timeout_s={timeout_s!r}: must be a finite number > 0")
        self.fn = fn
        self.timeout_s = float(timeout_s)
        self._is_async = inspect.iscoroutinefunction(fn)
        self._name = getattr(fn, "__qualname__", repr(fn))

    async def __call__(self, *args: Any) -> RewardResult:
        call = self.fn(*args) if self._is_async else asyncio.to_thread(self.fn, *args)
        try:
            value = await asyncio.wait_for(call, self.timeout_s)
        except TimeoutError:
            return RewardResult(0.0, f"reward {self._name} timed out after {self.timeout_s:g}s")
        except Exception as e:  # noqa: BLE001 -- any failure of user code is one failed reward
            return RewardResult(0.0, f"reward {self._name} raised {type(e).__name__}: {e}")
        # bool is a Real, but True as a reward is almost always a bug in the function.
        if isinstance(value, bool) or not isinstance(value, Real):
            return RewardResult(0.0, f"reward {self._name} returned {value!r}: not a number")
        if not math.isfinite(value):
            return RewardResult(0.0, f"reward {self._name} returned {value!r}: not finite")
        return RewardResult(float(value))


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
