"""The reward worker process: load a reward function by its dotted path, then answer calls.

This module is all that a reward worker imports before the function's own module
(tasks/reward_pool.py starts the workers): the fork server preloads it, so it must stay light —
the standard library only, no JAX, no `jaxrl_async.tasks` (whose package imports every task).
It also holds `load_reward_fn`, the one resolver of a dotted path, which the tasks use at
start-up to fail early on a bad path.

Protocol on the pipe: the worker sends ("ready", None) or ("start_error", reason) once; then, for
each args tuple it receives, ("ok", value) or ("raised", (exception type name, message)).
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import signal
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any


def serve(conn: Connection, fn_path: str) -> None:
    """A worker's loop: load the function, say ready, then answer one call at a time."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        fn = load_reward_fn(fn_path)
    except BaseException as e:  # noqa: BLE001 -- reported to the parent, which fails the call
        conn.send(("start_error", f"{type(e).__name__}: {e}"))
        return
    conn.send(("ready", None))
    is_async = inspect.iscoroutinefunction(fn)
    while True:
        try:
            args = conn.recv()
        except EOFError:  # the parent closed the pipe: the pool is done
            return
        try:
            value = asyncio.run(fn(*args)) if is_async else fn(*args)
            reply = ("ok", value)
        except Exception as e:  # noqa: BLE001 -- any failure of user code is one failed reward
            reply = ("raised", (type(e).__name__, str(e)))
        try:
            conn.send(reply)
        except Exception as e:  # noqa: BLE001 -- an unpicklable return value
            conn.send(("raised", (type(e).__name__, f"return value cannot be sent back: {e}")))


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
