"""Faults a real run must survive: a bad reward function, a non-finite loss, a request the engine
never returns, and an engine that stops streaming."""

import logging
import math
import time
from collections.abc import AsyncIterator

import jax
import numpy as np
import pytest

from jaxrl_async.engines.base import GenerationEngine, SampleOutput
from jaxrl_async.runtime.liveness import EngineHungError
from planner.ledger_audit import audit
from tests.helpers.engines import SilentRequestEngine, SlowRequestEngine, WrappedEngine
from tests.helpers.train_runs import StepProbe, make_job, read_jsonl, run_within

pytestmark = pytest.mark.slow

SMALL = ["steps=4", "batch_groups=2", "group_size=4", "max_new_tokens=4"]


def flaky_reward(prompt_text: str, completion_text: str, answer) -> float:
    """A user reward that raises on letter a, hangs past the timeout on b, works otherwise."""
    if answer == "a":
        raise RuntimeError("reward service unavailable")
    if answer == "b":
        time.sleep(1.0)
    return completion_text.count(answer) / max(1, len(completion_text))


def test_a_reward_function_that_raises_or_times_out_scores_zero_is_counted_and_the_group_is_trained(tmp_path):
    # Every reward fails here: the failure-rate stop (tests/faults/test_reward_faults.py) is off.
    job = make_job(tmp_path, SMALL + ["task.alphabet=ab", "task.num_prompts=4", "task.reward_timeout_s=0.2",
                                      "task.max_reward_failure_rate=1",
                                      "task.reward_fn=tests.jaxrl_async.runtime.test_controller_faults:flaky_reward"])
    summary = job.run()
    # Every sample of every prompt failed: half raised, half timed out.
    assert summary["reward_errors"] == summary["rewards_scored"] == 2 * 4 * 4
    assert summary["groups_trained"] == 8 and summary["groups_dropped"] == 0 and summary["audit_ok"]
    metrics = read_jsonl(tmp_path / "metrics.jsonl")
    assert all(m["reward_mean"] == 0.0 for m in metrics)
    assert metrics[-1]["reward_errors"] == 32


class NaNLogprobEngine(WrappedEngine):
    """The real engine, with one sample's behaviour log-probs turned into NaN (what an fp overflow in
    a real engine looks like). The group that holds it makes its batch's loss non-finite."""

    def __init__(self, inner: GenerationEngine, request_id: str) -> None:
        super().__init__(inner)
        self.request_id = request_id

    async def outputs(self) -> AsyncIterator[SampleOutput]:
        async for out in self.inner.outputs():
            if out.request_id == self.request_id and out.sample_index == 0:
                out = SampleOutput(out.request_id, 0, out.token_ids, [math.nan] * len(out.logprobs),
                                   out.versions, out.finish_reason, out.done)
            yield out


def param_fingerprint(trainer) -> float:
    return float(sum(np.abs(np.asarray(x, np.float64)).sum() for x in jax.tree.leaves(trainer.params(copy=False))))


def test_a_nan_loss_skips_the_step_reports_it_and_leaves_the_weights_unchanged(tmp_path):
    job = make_job(tmp_path, SMALL + ["max_staleness=0"])  # η = 0: uid 0 is in batch 0
    controller = job.controller
    controller.engine = NaNLogprobEngine(controller.engine, "0.0")
    before = param_fingerprint(job.trainer)
    prints = []
    controller.sinks.append(StepProbe(lambda r: prints.append((r["step"], r["skipped"], param_fingerprint(job.trainer)))))
    summary = job.run()
    assert [(s, k) for s, k, _ in prints] == [(0, 1), (1, 0), (2, 0), (3, 0)]
    assert prints[0][2] == before  # the skipped update left the weights as they were
    assert prints[1][2] != before  # the next one trained
    assert summary["steps_skipped"] == 1 and summary["steps"] == 4
    assert job.trainer.version == 3  # applied updates; the run still published versions 1..3
    metrics = read_jsonl(tmp_path / "metrics.jsonl")
    assert metrics[0]["skipped"] == 1 and metrics[0]["loss"] is None  # NaN is written as null
    report = audit(tmp_path, 0)
    assert report.ok and report.max_token_staleness == 0, report.verdict()


@pytest.mark.parametrize("after", [0, 1], ids=["never-started", "stuck-mid-generation"])
def test_a_request_the_engine_never_returns_is_regenerated_after_the_stall_timeout_and_trained_once(
        tmp_path, caplog, after):
    # η = 1 with B = 2: group 1 belongs to batch 0, which cannot be trained without it, so the run
    # would wedge (no policy here drops it) unless the watchdog regenerates it. The regenerated
    # request may need a prefill shape not compiled yet; on a loaded machine that compile outlasts
    # a 2 s timeout or two, so the engine may be quiet for several rounds without hanging.
    job = make_job(tmp_path, SMALL + ["max_staleness=1", "rollout.stall_timeout_s=2", "rollout.max_quiet_stalls=10"])
    engine = SilentRequestEngine(job.controller.engine, "1.0", after=after)
    job.controller.engine = engine
    caplog.set_level(logging.WARNING, logger="jaxrl_async.runtime.liveness")
    t0 = time.monotonic()
    summary = run_within(job, 90)
    assert engine.swallowed > 0  # the engine really kept pieces of request 1.0 back
    assert summary["completed"] and summary["steps"] == 4 and summary["audit_ok"], summary
    assert summary["groups_stalled"] >= 1 and summary["groups_readmitted"] == summary["groups_stalled"]
    stalls = [r.getMessage() for r in caplog.records if "rollout stalled" in r.getMessage()]
    assert any("group 1 (request 1.0) streamed no token for" in m for m in stalls), stalls
    ledger = read_jsonl(tmp_path / "ledger.jsonl")
    admits = [e["uid"] for e in ledger if e["event"] == "admit"]
    trained = [g["uid"] for e in ledger if e["event"] == "train" for g in e["groups"]]
    assert admits.count(1) >= 2 and trained.count(1) == 1
    report = audit(tmp_path, 1)
    assert report.ok and not report.lost and report.groups_dropped == 0 and report.readmissions >= 1, report.verdict()
    assert read_jsonl(tmp_path / "metrics.jsonl")[-1]["groups_stalled"] == summary["groups_stalled"]
    assert time.monotonic() - t0 < 120


def test_an_engine_that_streams_nothing_any_more_ends_the_run_with_a_one_line_error(tmp_path):
    job = make_job(tmp_path, SMALL + ["rollout.stall_timeout_s=1", "rollout.max_quiet_stalls=2"])
    engine = SilentRequestEngine(job.controller.engine, None, after=3)  # hangs after three pieces
    job.controller.engine = engine
    t0 = time.monotonic()
    with pytest.raises(EngineHungError, match=r"rollout: the engine streamed no token for \d+ s through 2 stall "
                                              r"rounds") as info:
        run_within(job, 90)
    assert engine.swallowed > 0 and "\n" not in str(info.value) and isinstance(info.value, ConnectionError)
    assert time.monotonic() - t0 < 120


def test_a_slow_group_that_keeps_streaming_is_never_taken_for_stalled(tmp_path):
    # Group 0's pieces arrive 1.5 s apart: it generates for longer than the timeout while never
    # going quiet for it.
    job = make_job(tmp_path, SMALL + ["rollout.stall_timeout_s=4"])
    engine = SlowRequestEngine(job.controller.engine, "0.0", delay_s=1.5)
    job.controller.engine = engine
    summary = run_within(job, 90)
    assert engine.pieces * engine.delay_s > 4, engine.pieces  # it really took longer than the timeout
    assert summary["groups_stalled"] == 0 and summary["groups_readmitted"] == 0 and summary["audit_ok"]
