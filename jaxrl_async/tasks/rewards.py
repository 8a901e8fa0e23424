"""Scoring a completion so that a bad reward costs that reward, never the run, and never lies.

A reward function may be slow, raise, hang or return garbage (NaN, a string). Every such outcome
becomes `RewardResult(FALLBACK, error, kind)` for that sample only: the runtime counts it by
`kind`, logs its reason, and stops the run when too many of a batch's rewards failed
(`task.max_reward_failure_rate`, runtime/scoring.py) — a failed reward is never silent.

Where a reward runs (decided per reward, see `Task.__init__`):

- a user `reward_fn` (a dotted import path `pkg.module:function` or `pkg.module.function`,
  `(prompt_text, completion_text, answer) -> float`, sync or async): in killable worker
  processes (tasks/reward_pool.py), since nothing is known about it; a hung call is killed at
  `task.reward_timeout_s` and its worker replaced;
- a built-in verifier that may hang on adversarial input (math-verify's sympy work, gsm8k): in
  the same worker processes (`Task.isolated_score`);
- a built-in `score` that is pure string work (the synthetic tasks, arithmetic, exact match):
  in-process through `RewardRunner`, awaited under the timeout — safe and fast, so a process
  round trip per reward would cost more than it guards.

A path that does not resolve to a callable is a start-up `ValueError`.
"""

from __future__ import annotations

import asyncio
import inspect
import math
from collections.abc import Callable
from dataclasses import dataclass
from numbers import Real
from typing import Any

from jaxrl_async.reward_worker import load_reward_fn  # noqa: F401 -- the tasks' name for it

TIMEOUT, NOT_A_NUMBER, NOT_FINITE = "timeout", "not_a_number", "not_finite"
FALLBACK = 0.0  # the reward of a failed call: a legal, uninformative GRPO signal for its group


@dataclass(frozen=True)
class RewardResult:
    value: float  # the reward; FALLBACK whenever `error` is set
    error: str | None = None  # why the function's own value was not used (timeout, exception, bad value)
    kind: str | None = None  # the error's type: timeout | worker_died | worker_start | not_a_number | not_finite | exception class name


def checked(name: str, value: Any) -> RewardResult:
    """A function's return value as a reward: a finite real number, else a failed reward."""
    # bool is a Real, but True as a reward is almost always a bug in the function.
    if isinstance(value, bool) or not isinstance(value, Real):
        return RewardResult(FALLBACK, f"reward {name} returned {value!r}: not a number", NOT_A_NUMBER)
    if not math.isfinite(value):
        return RewardResult(FALLBACK, f"reward {name} returned {value!r}: not finite", NOT_FINITE)
    return RewardResult(float(value))


class RewardRunner:
    """Calls a built-in, known-safe `fn(*args)` in-process (module docstring): an async function is
    awaited under `timeout_s` and cancelled at it; a sync one is called directly (it must be fast:
    a sync function that may hang belongs in a `RewardPool`)."""

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
        try:
            if self._is_async:
                value = await asyncio.wait_for(self.fn(*args), self.timeout_s)
            else:
                value = self.fn(*args)
        except TimeoutError:
            return RewardResult(FALLBACK, f"reward {self._name} timed out after {self.timeout_s:g}s", TIMEOUT)
        except Exception as e:  # noqa: BLE001 -- any failure of a reward is one failed reward
            return RewardResult(FALLBACK, f"reward {self._name} raised {type(e).__name__}: {e}", type(e).__name__)
        return checked(self._name, value)
