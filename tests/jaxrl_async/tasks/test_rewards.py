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
