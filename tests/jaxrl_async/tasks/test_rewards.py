"""RewardRunner (built-in scores, in-process) and reward paths: a bad reward costs its fallback and an\nerror, never the run. The user functions' worker processes: test_reward_pool.py."""

import asyncio
import math
import time

import pytest

from jaxrl_async.tasks import RewardResult, RewardRunner, build_task, load_reward_fn
from jaxrl_async.tasks.base import Prompt
from jaxrl_async.tasks.rewards import FALLBACK


def length_reward(prompt_text, completion_text, answer):
    return len(completion_text) / 10


async def async_answer_reward(prompt_text, completion_text, answer):
    await asyncio.sleep(0)
    return float(completion_text == answer)


def _run(runner, *args):
    return asyncio.run(runner(*args))


def test_a_sync_builtin_score_is_called_in_process_and_returns_its_value():
    assert _run(RewardRunner(lambda x: x, 5), 0.5) == RewardResult(0.5, None)


def test_an_async_function_is_awaited():
    assert _run(RewardRunner(async_answer_reward, 5), "q", "7", "7") == RewardResult(1.0, None)


def test_an_async_score_past_its_timeout_is_cancelled_and_scores_the_fallback_with_the_reason():
    async def slow_async():
        await asyncio.sleep(5)
        return 1.0

    start = time.perf_counter()
    result = _run(RewardRunner(slow_async, 0.05))
    assert time.perf_counter() - start < 1.0
    assert result.value == FALLBACK == 0.0 and result.kind == "timeout" and "timed out after 0.05s" in result.error


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


def test_error_kinds_name_the_failure():
    def broken():
        raise KeyError("x")

    assert _run(RewardRunner(broken, 5)).kind == "KeyError"
    assert _run(RewardRunner(lambda: "1", 5)).kind == "not_a_number"
    assert _run(RewardRunner(lambda: math.nan, 5)).kind == "not_finite"
