"""Score a finished group: decode every sample and ask the task for its reward, all at once.

`Task.reward` never raises (a failing, hanging or garbage-returning reward function scores 0.0
with the reason attached, see `tasks/rewards.py`); this module collects the values and the
errors so that the controller can count them and still train the group, and says why they failed:
`RewardErrorLog` logs the first few reasons verbatim and counts all of them by kind (summary.json
`reward_errors_by_type`, with one line at the end of the run) — a count alone hides whether a
reward service is down, a function has a bug, or the timeout is too short.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from dataclasses import dataclass

from jaxrl_async.runtime.rollouts import GroupRollout
from jaxrl_async.tasks.base import Prompt, Task
from jaxrl_async.tasks.rewards import RewardResult
from jaxrl_async.tokenizer import Tokenizer

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class GroupScore:
    rewards: list[float]
    errors: list[RewardResult]  # one per failed sample (its reward is 0.0), with its reason and kind


async def score_group(task: Task, tokenizer: Tokenizer, prompt: Prompt, group: GroupRollout) -> GroupScore:
    """Rewards of the group's samples, in sample order (the stop token is not part of the text)."""
    results = await asyncio.gather(*(
        task.reward(prompt, tokenizer.decode(s.token_ids), s.token_ids) for s in group.samples))
    return GroupScore([r.value for r in results], [r for r in results if r.error is not None])


class RewardErrorLog:
    """The first `verbatim` reward errors of a run segment as warnings, then counts by kind."""

    def __init__(self, verbatim: int = 5) -> None:
        self.verbatim = verbatim
        self._logged = 0

    def record(self, counts: Counter, uid: int, errors: list[RewardResult]) -> None:
        """Count `errors` (of group `uid`) by kind into `counts` (RunStats.reward_errors_by_type)."""
        for error in errors:
            counts[error.kind or "error"] += 1
            if self._logged < self.verbatim:
                self._logged += 1
                more = " (further reward errors are only counted, by kind, in summary.json)" \
                    if self._logged == self.verbatim else ""
                log.warning("reward error (group %d): %s%s", uid, error.error, more)

    @staticmethod
    def report(counts: Counter) -> None:
        """One line with every count, at the end of the run (nothing when there was no error)."""
        if counts:
            log.warning("reward errors by kind: %s", ", ".join(f"{k} {n}" for k, n in sorted(counts.items())))
