"""Scoring a group: its rewards, its failures logged and counted by kind, and the failure-rate gate."""

import asyncio
import logging
from collections import Counter

import pytest

from jaxrl_async.runtime.scoring import GroupScore, RewardErrorLog, RewardFailureGate, score_group
from jaxrl_async.tasks.rewards import RewardResult


def _score(values: list[float | None]) -> GroupScore:
    """A group's score: None is a failed reward (the fallback 0.0 with a timeout error)."""
    results = [RewardResult(0.0, "timed out", "timeout") if v is None else RewardResult(v) for v in values]
    return GroupScore([r.value for r in results], [r for r in results if r.error], tuple(v is None for v in values))


def test_the_gate_waits_for_a_batch_worth_of_rewards_before_it_judges():
    gate = RewardFailureGate(0.5, window=8)
    assert gate.add(_score([None, None, None, None])) is None  # 4 of 4 failed, but not a batch's worth yet
    assert gate.add(_score([None, None, None, None])) is not None  # 8 of 8


def test_the_gate_stops_past_the_rate_over_the_last_batch_of_rewards_only():
    gate = RewardFailureGate(0.5, window=8)
    assert gate.add(_score([0.5, 0.5, 0.5, 0.5])) is None
    assert gate.add(_score([None, None, None, None])) is None  # 4 of 8: at the rate, not past it
    reason = gate.add(_score([None, 0.5, 0.5, 0.5]))  # the last 8: 4 failed + 1 failed of the newest
    assert reason is not None and reason.startswith("5 of the last 8 rewards failed (62% > task.max_reward_failure_rate=0.5)")
    assert gate.add(_score([0.5, 0.5, 0.5, 0.5])) is None  # the failed group slid out: 1 of 8


@pytest.mark.parametrize("rate, stops", [(1.0, False), (0.0, True)])
def test_rate_one_never_stops_and_rate_zero_stops_at_any_failure(rate, stops):
    gate = RewardFailureGate(rate, window=4)
    assert (gate.add(_score([None, None, None, None] if rate == 1.0 else [0.5, 0.5, 0.5, None])) is not None) == stops


def test_score_group_keeps_sample_order_and_marks_each_failed_sample():
    class Task:
        async def reward(self, prompt, text, ids):
            return RewardResult(0.0, "raised", "ValueError") if text == "b" else RewardResult(len(text) / 4)

    class Tokenizer:
        def decode(self, ids):
            return "".join(ids)

    class Sample:
        episode = None  # a single-turn sample: the task scores its text

        def __init__(self, token_ids):
            self.token_ids = token_ids

    class Group:
        samples = [Sample(["a", "a"]), Sample(["b"]), Sample(["a"])]

    score = asyncio.run(score_group(Task(), Tokenizer(), None, Group()))
    assert score.rewards == [0.5, 0.0, 0.25] and score.failed == (False, True, False)
    assert [e.kind for e in score.errors] == ["ValueError"]


def test_the_error_log_says_the_first_reasons_then_only_counts_by_kind(caplog):
    log, counts = RewardErrorLog(verbatim=2), Counter()
    with caplog.at_level(logging.WARNING):
        log.record(counts, 7, _score([None, None, None]).errors)
        RewardErrorLog.report(counts)
    lines = [r.getMessage() for r in caplog.records]
    assert lines[:2] == ["reward error (group 7): timed out",
                         "reward error (group 7): timed out (further reward errors are only counted, by kind, in "
                         "summary.json)"]
    assert lines[2:] == ["reward errors by kind: timeout 3"] and counts == {"timeout": 3}
