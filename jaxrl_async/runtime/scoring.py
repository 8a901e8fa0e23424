"""Score a finished group: decode every sample and ask the task for its reward, all at once.

`Task.reward` never raises (a failing, hanging or garbage-returning reward function scores the
fallback for that sample with the reason attached, see `tasks/rewards.py`); this module collects
the values and the errors so that the controller can count them, says why they failed, and
decides when the failures are too many to train on:

- `RewardErrorLog` logs the first few reasons verbatim and counts all of them by kind
  (summary.json `reward_errors_by_type`, one line at the end of the run and in the final
  report) — a count alone hides whether a reward service is down, a function has a bug, or the
  timeout is too short.
- `RewardBook` is what the controller calls: it gives a group its rewards, counts them and their
  failures into the run's totals, and keeps the failure that stops the run.
- `RewardFailureGate` keeps the outcome of the last batch's worth of rewards (batch_groups x
  group_size, in the order they were scored) and, once that many were scored, says when more
  than `task.max_reward_failure_rate` of them failed. The controller asks it before the policy
  hears that a group is done, so the group never reaches a batch: the run saves a checkpoint and
  ends with `RewardFailureError` (one `error:` line). A trailing window rather than the batch
  the policy is about to select, because the check must come before the policy's decision for
  the checkpoint to be consistent; with every group at the same failure share the two agree.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from jaxrl_async.envs.episode import EpisodeRecord
from jaxrl_async.runtime.metrics import RunStats
from jaxrl_async.runtime.rollouts import GroupRollout, RolloutSample
from jaxrl_async.tasks.base import Prompt, Task
from jaxrl_async.tasks.rewards import FALLBACK, RewardResult, checked
from jaxrl_async.tokenizer import Tokenizer

if TYPE_CHECKING:
    from jaxrl_async.runtime.groups import LiveGroup

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class GroupScore:
    rewards: list[float]
    errors: list[RewardResult]  # one per failed sample (its reward is the fallback), with its reason and kind
    failed: tuple[bool, ...] = ()  # per sample, in sample order: its reward failed


def episode_reward(record: EpisodeRecord | None) -> RewardResult:
    """An episode's reward is its own result's; a faulted episode has none: a failed reward of its
    fault's kind (counted by the failure gate; in training the sample is left out of the loss,
    batching.py). The held-out evaluation scores its episodes by it too (evaluation.py)."""
    if record is None or record.fault is not None or record.result is None:
        fault = record.fault if record is not None else None
        kind = record.fault_kind if record is not None else None
        return RewardResult(FALLBACK, f"episode {fault or 'ended without a result'}", kind or "env_error")
    return checked("of the episode", record.result.reward)


async def sample_reward(task: Task, tokenizer: Tokenizer, prompt: Prompt, sample: RolloutSample) -> RewardResult:
    """One sample's reward: its episode's (multi-turn), else the task's reward of its text."""
    if sample.episode is not None:
        return episode_reward(sample.episode)
    return await task.reward(prompt, tokenizer.decode(sample.token_ids), sample.token_ids)


async def score_group(task: Task, tokenizer: Tokenizer, prompt: Prompt, group: GroupRollout) -> GroupScore:
    """Rewards of the group's samples, in sample order (the stop token is not part of the text)."""
    results = await asyncio.gather(*(sample_reward(task, tokenizer, prompt, s) for s in group.samples))
    return GroupScore([r.value for r in results], [r for r in results if r.error is not None],
                      tuple(r.error is not None for r in results))


async def score_groups(task: Task, tokenizer: Tokenizer, groups: Sequence[LiveGroup]) -> list[GroupScore]:
    """The scores of several groups at once (a checkpoint's done groups whose rewards failed)."""
    return list(await asyncio.gather(*(score_group(task, tokenizer, g.prompt, g.rollout) for g in groups)))


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


class RewardFailureError(ValueError):
    """Too many rewards of the last batch's worth failed: the run stops rather than train on them
    (a ValueError, so the entry point prints one `error:` line and exits 1)."""


class RewardFailureGate:
    """The trailing window of reward outcomes and the rule that stops the run (module docstring)."""

    def __init__(self, max_rate: float, window: int) -> None:
        if not 0.0 <= max_rate <= 1.0:
            raise ValueError(f"task.max_reward_failure_rate={max_rate!r}: must be in [0, 1]")
        self.max_rate = max_rate
        self._failed: deque[bool] = deque(maxlen=window)

    def add(self, score: GroupScore) -> str | None:
        """Record one group's rewards; the stop's reason when the window's failure share passes the rate."""
        self._failed.extend(score.failed)
        n, bad = len(self._failed), sum(self._failed)
        if n < self._failed.maxlen or bad <= self.max_rate * n:
            return None
        return (f"{bad} of the last {n} rewards failed ({bad / n:.0%} > task.max_reward_failure_rate="
                f"{self.max_rate:g}); stopped before training on them; the log names the first errors")


class RewardBook:
    """The run's rewards: each group's, their counts and failures, and the failure that ends the run.

    `window`: the last batch's worth of rewards (batch_groups x group_size); `resume_hint`: what
    the stop's message tells the user to run once the reward function is fixed; `on_failure()`:
    called when too many failed (the controller's `request_stop`).
    """

    def __init__(self, max_rate: float, window: int, resume_hint: str, *,
                 on_failure: Callable[[], None] = lambda: None) -> None:
        self.log = RewardErrorLog()
        self.gate = RewardFailureGate(max_rate, window)
        self.resume_hint = resume_hint
        self.on_failure = on_failure
        self.failure: RewardFailureError | None = None  # the run stops with it

    def give(self, stats: RunStats, rollout: GroupRollout, result: GroupScore) -> bool:
        """Give `rollout` its rewards and count their failures into `stats`; False, with `on_failure`
        called, when too many failed (the run stops: a checkpoint, then `failure` is raised)."""
        rollout.rewards, rollout.reward_errors = result.rewards, len(result.errors)
        stats.rewards_scored += len(result.rewards)
        stats.reward_errors += len(result.errors)
        self.log.record(stats.reward_errors_by_type, rollout.uid, result.errors)
        too_many = self.gate.add(result)
        if too_many is not None:
            self.failure = self.failure or RewardFailureError(
                f"{too_many}; checkpointed: fix the reward function and {self.resume_hint}")
            self.on_failure()
        return too_many is None
