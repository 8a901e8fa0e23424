"""Score a finished group: decode every sample and ask the task for its reward, all at once.

`Task.reward` never raises (a failing, hanging or garbage-returning reward function scores 0.0
with the reason attached, see `tasks/rewards.py`); this module collects the values and the
errors so that the controller can count them and still train the group.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from jaxrl_async.runtime.rollouts import GroupRollout
from jaxrl_async.tasks.base import Prompt, Task
from jaxrl_async.tokenizer import Tokenizer


@dataclass(frozen=True)
class GroupScore:
    rewards: list[float]
    errors: list[str]  # one per failed sample (its reward is 0.0)


async def score_group(task: Task, tokenizer: Tokenizer, prompt: Prompt, group: GroupRollout) -> GroupScore:
    """Rewards of the group's samples, in sample order (the stop token is not part of the text)."""
    results = await asyncio.gather(*(
        task.reward(prompt, tokenizer.decode(s.token_ids), s.token_ids) for s in group.samples))
    return GroupScore([r.value for r in results], [r.error for r in results if r.error is not None])
