"""Scoring a completion with a task's reward, for the task tests."""

import asyncio

from jaxrl_async.tasks import Prompt


def score(task, answer, completion):
    """`task`'s reward for `completion` when the answer is `answer`; the reward must not fail."""
    prompt = Prompt("p", "", [], answer, {"content": ""})
    result = asyncio.run(task.reward(prompt, completion, []))
    assert result.error is None
    return result.value
