"""The controller's asyncio tasks: the first failure of any of them ends the run.

The controller runs each event source as a task (engine outputs, scoring, the train step, the
stall watchdog, stops); none may fail silently, since a policy that never hears an event would
wait forever. `TaskSupervisor.spawn` runs a coroutine function as a task; its first exception is
kept and ends the run (`done`), and `wait` re-raises it in `Controller.run`. The coroutine is made
inside the task, so a task cancelled before it starts leaves no never-awaited coroutine behind.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any


class TaskSupervisor:
    """Tasks of one run; `done` is set by `finish` (the run's normal end) or by a task's failure."""

    def __init__(self) -> None:
        self.done = asyncio.Event()
        self.error: BaseException | None = None
        self._tasks: set[asyncio.Task] = set()

    def spawn(self, fn: Callable[..., Awaitable[Any]], *args: Any) -> None:
        task = asyncio.get_running_loop().create_task(self._guard(fn, *args))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _guard(self, fn: Callable[..., Awaitable[Any]], *args: Any) -> None:
        try:
            await fn(*args)
        except asyncio.CancelledError:
            raise
        except BaseException as error:  # noqa: BLE001 - any failure ends the run, re-raised by wait()
            if self.error is None:
                self.error = error
            self.done.set()

    def finish(self) -> None:
        self.done.set()

    async def wait(self) -> None:
        """Until the run ends; re-raises the first failure of a task."""
        await self.done.wait()
        if self.error is not None:
            raise self.error

    async def cancel_all(self) -> None:
        """Cancel every task still running and wait until each has ended."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
