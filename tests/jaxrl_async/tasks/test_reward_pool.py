"""RewardPool: user rewards in worker processes that a deadline kills, so a hung call costs one
reward, never a thread, a process or the rewards of the prompts that work."""

import asyncio
import os
import threading
import time
from multiprocessing import forkserver
from pathlib import Path

import pytest

from jaxrl_async.tasks.reward_pool import RewardPool
from jaxrl_async.tasks.rewards import FALLBACK, RewardResult

HERE = "tests.helpers.reward_fns"  # light to import: workers start at once


def _workers() -> list[int]:
    """Pids of the live (not zombie) processes the fork server forked for this test process: the
    reward workers, read from /proc."""
    server = forkserver._forkserver._forkserver_pid
    pids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # the process ended meanwhile
            continue
        if int(fields[1]) == server and fields[0] != "Z":
            pids.append(int(stat.parent.name))
    return pids


def test_a_hung_call_is_killed_at_its_deadline_and_the_working_prompts_score_their_real_values():
    pool = RewardPool(f"{HERE}:hangs_on_c", 1.0, workers=4)
    prompts = ["apple", "cherry", "banana", "cocoa", "avocado", "cab"]

    async def main():
        await pool("warm", "x", "x")  # the first worker's start-up is not part of the test's bound
        start = time.monotonic()
        results = await asyncio.gather(*(pool(p, "aab", "a") for p in prompts))
        return results, time.monotonic() - start

    try:
        results, wall_s = asyncio.run(main())
        by_prompt = dict(zip(prompts, results))
        for p in ("cherry", "cocoa", "cab"):
            assert by_prompt[p].kind == "timeout" and by_prompt[p].value == FALLBACK
            assert "timed out after 1s (its worker process was killed)" in by_prompt[p].error
        for p in ("apple", "banana", "avocado"):  # the real value, non-trivially nonzero
            assert by_prompt[p] == RewardResult(2 / 3)
        assert wall_s < 10, wall_s  # the deadline plus fresh workers' start, never the hang
        assert pool.killed == 3 and pool.processes <= 4
    finally:
        pool.close()


def test_many_hung_calls_leave_no_process_or_thread_behind_and_later_calls_still_run_the_function():
    pool = RewardPool(f"{HERE}:hangs_on_c", 0.3, workers=2)
    threads = threading.active_count()
    others = set(_workers()) if forkserver._forkserver._forkserver_pid else set()  # earlier tests' pools

    async def main():
        hung = await asyncio.gather(*(pool("c", "a", "a") for _ in range(12)))
        return hung, await pool("a", "aa", "a")

    try:
        hung, working = asyncio.run(main())
        assert [r.kind for r in hung] == ["timeout"] * 12 and pool.killed == 12
        assert working == RewardResult(1.0)  # called and scored: no cap turned it into a fabricated 0.0
        assert pool.processes <= 2 and 1 <= len(set(_workers()) - others) <= 2  # the killed ones are gone, reaped
        assert threading.active_count() <= threads
    finally:
        pool.close()
    assert set(_workers()) - others == set()


def test_a_raising_reward_falls_back_for_that_sample_only_and_its_worker_is_reused():
    pool = RewardPool(f"{HERE}:raises_on_b", 5.0, workers=1)

    async def main():
        return [await pool(p, "ab", "a") for p in ("apple", "banana", "avocado")]

    try:
        apple, banana, avocado = asyncio.run(main())
        assert apple == avocado == RewardResult(0.5)
        assert banana.value == FALLBACK and banana.kind == "ValueError"
        assert "raised ValueError: cannot score 'banana'" in banana.error
        assert pool.killed == 0 and pool.processes == 1
    finally:
        pool.close()


def test_a_worker_that_dies_mid_call_fails_that_call_and_is_replaced():
    pool = RewardPool(f"{HERE}:dies_on_d", 5.0, workers=1)

    async def main():
        return [await pool(p, "", None) for p in ("date", "apple")]

    try:
        died, after = asyncio.run(main())
        assert died.kind == "worker_died" and "exit code 3" in died.error and after == RewardResult(0.75)
    finally:
        pool.close()


def test_garbage_and_async_rewards_are_checked_and_awaited_in_the_worker():
    garbage, awaited = RewardPool(f"{HERE}:returns_text", 5.0), RewardPool(f"{HERE}:async_reward", 5.0)
    try:
        assert asyncio.run(garbage("a", "b", "c")).kind == "not_a_number"
        assert asyncio.run(awaited("a", "b", "c")) == RewardResult(0.5)
    finally:
        garbage.close()
        awaited.close()


def test_the_reward_runs_in_another_process_and_a_bad_path_fails_at_construction():
    pool = RewardPool(f"{HERE}:worker_pid", 5.0, workers=1)
    try:
        assert asyncio.run(pool("a", "b", "c")).value not in (0.0, float(os.getpid()))
    finally:
        pool.close()
    with pytest.raises(ValueError, match="has no attribute 'nope'"):
        RewardPool(f"{HERE}:nope", 5.0)
