"""User reward functions that misbehave on purpose, for the reward worker tests
(tests/jaxrl_async/tasks/test_reward_pool.py, tests/faults/test_reward_faults.py).

A reward worker imports the function's module each time it starts (tasks/reward_pool.py), and a
test kills many workers: this module imports the standard library only, so that a fresh worker is
ready at once. Each function's failure depends on the prompt only, never on a counter: every
worker is a separate process and sees no other worker's state.
"""

import asyncio
import os
import threading

WORKING = 0.5  # the e2e tests' reward of a working prompt: a real value a fabricated 0.0 cannot match
FIXED = "REWARD_FAULTS_FIXED"  # set in the environment: fails_unless_apple works for every prompt


def hangs_on_c(prompt_text: str, completion_text: str, answer) -> float:
    """The issue's reward: hangs on prompts starting with "c", scores the others for real."""
    if prompt_text.startswith("c"):
        threading.Event().wait()
    return completion_text.count(answer) / max(1, len(completion_text))


def raises_on_b(prompt_text: str, completion_text: str, answer) -> float:
    if prompt_text.startswith("b"):
        raise ValueError(f"cannot score {prompt_text!r}")
    return completion_text.count(answer) / max(1, len(completion_text))


def dies_on_d(prompt_text: str, completion_text: str, answer) -> float:
    if prompt_text.startswith("d"):
        os._exit(3)
    return 0.75


def returns_text(prompt_text: str, completion_text: str, answer):
    return "1.0"


async def async_reward(prompt_text: str, completion_text: str, answer) -> float:
    await asyncio.sleep(0)
    return 0.5


def worker_pid(prompt_text: str, completion_text: str, answer) -> float:
    return float(os.getpid())


def hangs_on_c_else_working(prompt_text: str, completion_text: str, answer) -> float:
    if prompt_text.startswith("c"):
        threading.Event().wait()
    return WORKING


def raises_on_b_else_working(prompt_text: str, completion_text: str, answer) -> float:
    if prompt_text.startswith("b"):
        raise ValueError(f"no reference answer for {prompt_text!r}")
    return WORKING


def fails_unless_apple(prompt_text: str, completion_text: str, answer) -> float:
    """Fails for every prompt but "apple" (a reward service that is down) until FIXED is set."""
    if prompt_text != "apple" and not os.environ.get(FIXED):
        raise ConnectionError("reward service unavailable")
    return WORKING
