"""RewardRunner and user reward functions: a bad reward costs 0.0 and an error, never the run."""

import asyncio
import math
import time

import pytest

from jaxrl_async.tasks import RewardResult, RewardRunner, build_task, load_reward_fn
from jaxrl_async.tasks.base import Prompt


def length_reward(prompt_text, completion_text, answer):
    return len(completion_text) / 10


async def async_answer_reward(prompt_text, completion_text, answer):
    await asyncio.sleep(0)
    return float(completion_text == answer)


def _run(runner, *args):
    return asyncio.run(runner(*args))


def test_a_sync_function_runs_in_a_worker_thread_and_returns_its_value():
    import threading
    threads = []

    def reward(x):
        threads.append(threading.current_thread())
        return x

    assert _run(RewardRunner(reward, 5), 0.5) == RewardResult(0.5, None)
    assert threads[0] is not threading.main_thread()


def test_an_async_function_is_awaited():
    assert _run(RewardRunner(async_answer_reward, 5), "q", "7", "7") == RewardResult(1.0, None)


def test_a_timeout_scores_zero_with_the_reason_for_sync_and_async_functions():
    async def slow_async():
        await asyncio.sleep(5)
        return 1.0

    for fn in (lambda: time.sleep(0.5) or 1.0, slow_async):
        start = time.perf_counter()
        result = _run(RewardRunner(fn, 0.05))
        assert time.perf_counter() - start < 1.0
        assert result.value == 0.0 and "timed out after 0.05s" in result.error


def test_an_exception_scores_zero_and_records_it():
    def broken(text):
        raise KeyError(text)

    result = _run(RewardRunner(broken, 5), "boom")
    assert result.value == 0.0 and "raised KeyError: 'boom'" in result.error


@pytest.mark.parametrize("bad", [math.nan, math.inf, "1.0", None, True])
def test_a_non_finite_or_non_number_return_scores_zero_with_an_error(bad):
    result = _run(RewardRunner(lambda: bad, 5))
    assert result.value == 0.0 and repr(bad) in result.error


@pytest.mark.parametrize("path", ["tests.jaxrl_async.tasks.test_rewards:length_reward",
                                  "tests.jaxrl_async.tasks.test_rewards.length_reward"])
def test_both_dotted_path_forms_resolve_to_the_function(path):
    assert load_reward_fn(path) is length_reward


@pytest.mark.parametrize("path, message", [
    ("no_such_module_xyz:f", "cannot import module 'no_such_module_xyz'"),
    ("tests.jaxrl_async.tasks.test_rewards:nope", "has no attribute 'nope'"),
    ("math:pi", "'pi' is a float, not a function"),
    ("length_reward", "must be a dotted path"),
])
def test_a_bad_dotted_path_is_a_one_line_error_at_start_up(path, message):
    with pytest.raises(ValueError, match=message) as info:
        build_task({"name": "repeat_letter", "reward_fn": path})
    assert "\n" not in str(info.value) and repr(path) in str(info.value)


def test_a_reward_fn_on_a_builtin_task_replaces_its_score_and_sees_the_raw_prompt():
    task = build_task({"name": "gsm8k", "reward_fn": "tests.jaxrl_async.tasks.test_rewards:async_answer_reward"})
    prompt = Prompt("p", "<templated>", [1], "18", {"content": "question"})
    assert asyncio.run(task.reward(prompt, "18", [])) == RewardResult(1.0, None)
    assert asyncio.run(task.reward(prompt, "\\boxed{18}", [])) == RewardResult(0.0, None)


def test_a_sync_function_runs_in_a_daemon_thread_of_the_runners_own_not_the_default_executor():
    import threading
    seen = []

    async def main(runner):
        default = []
        await asyncio.get_running_loop().run_in_executor(None, lambda: default.append(threading.current_thread()))
        await runner()
        return default[0]

    runner = RewardRunner(lambda: seen.append(threading.current_thread()) or 1.0, 5)
    default = asyncio.run(main(runner))
    assert seen[0].daemon and seen[0].name.startswith("reward-") and seen[0] is not default


def test_a_hung_call_is_abandoned_its_slot_freed_and_later_calls_still_score():
    release = __import__("threading").Event()
    calls = []

    def hangs_first(x):
        calls.append(x)
        if len(calls) == 1:
            release.wait()  # the first call hangs until released
        return x

    runner = RewardRunner(hangs_first, 0.1, max_workers=1)

    async def main():
        first = await asyncio.wait_for(runner(0.5), 5)  # a runner that waits for the hung call fails here
        # One slot only: had the hung call kept it, these would wait forever (wait_for catches that).
        later = await asyncio.wait_for(asyncio.gather(*(runner(0.25) for _ in range(3))), 5)
        return first, later

    first, later = asyncio.run(main())
    assert first.kind == "timeout" and first.value == 0.0
    assert [r.value for r in later] == [0.25] * 3 and runner.hung == 1
    release.set()
    for _ in range(100):
        if runner.hung == 0:
            break
        time.sleep(0.01)
    assert runner.hung == 0  # the abandoned call returned: no longer counted


def test_beyond_the_hung_cap_a_reward_scores_zero_without_calling_the_function_until_one_returns():
    import threading
    release = threading.Event()
    calls = []

    def always_hangs():
        calls.append(1)
        release.wait()
        return 1.0

    runner = RewardRunner(always_hangs, 0.05, max_workers=4, max_hung=2)
    results = [_run(runner) for _ in range(4)]
    assert [r.kind for r in results] == ["timeout", "timeout", "hung_cap", "hung_cap"]
    assert len(calls) == 2 and "2 earlier calls still hang past their timeout (cap 2)" in results[2].error
    release.set()
    for _ in range(100):
        if runner.hung == 0:
            break
        time.sleep(0.01)
    assert _run(runner) == RewardResult(1.0, None)  # called again once the hung ones returned


def test_error_kinds_name_the_failure():
    def broken():
        raise KeyError("x")

    assert _run(RewardRunner(broken, 5)).kind == "KeyError"
    assert _run(RewardRunner(lambda: "1", 5)).kind == "not_a_number"
    assert _run(RewardRunner(lambda: math.nan, 5)).kind == "not_finite"


def test_a_process_whose_reward_call_hangs_forever_still_exits():
    import subprocess
    import sys

    code = ("import asyncio, threading\n"
            "from jaxrl_async.tasks.rewards import RewardRunner\n"
            "r = RewardRunner(lambda: threading.Event().wait(), 0.1)\n"
            "print(asyncio.run(r()).kind)\n")
    start = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "timeout", out.stderr
    assert time.perf_counter() - start < 30
