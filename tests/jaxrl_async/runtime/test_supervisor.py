"""The controller's tasks (runtime/supervisor.py): the first failure ends the run and is re-raised."""

import asyncio
import gc

import pytest

from jaxrl_async.runtime.supervisor import TaskSupervisor


def test_the_first_failing_task_ends_the_run_and_its_error_is_raised_by_wait():
    async def main():
        tasks, started = TaskSupervisor(), []

        async def sleeper():
            started.append("sleeper")
            await asyncio.sleep(30)

        async def fail(message):
            await asyncio.sleep(0)
            raise ValueError(message)

        tasks.spawn(sleeper)
        tasks.spawn(fail, "first")
        tasks.spawn(fail, "second")
        with pytest.raises(ValueError, match="first"):
            await asyncio.wait_for(tasks.wait(), 5)
        await tasks.cancel_all()
        return started

    assert asyncio.run(main()) == ["sleeper"]


def test_finish_ends_the_wait_and_a_task_cancelled_before_it_starts_never_runs(recwarn):
    async def main():
        tasks, ran = TaskSupervisor(), []

        async def work():
            ran.append(1)

        tasks.spawn(work)
        await tasks.cancel_all()  # before its first step: its coroutine is never made
        tasks.finish()
        await asyncio.wait_for(tasks.wait(), 5)
        return ran, tasks.error

    assert asyncio.run(main()) == ([], None)
    gc.collect()
    assert not [w for w in recwarn if "was never awaited" in str(w.message)]
