"""`python -m jaxrl_async.train` on a shipped multi-turn environment (task=guess_number, tiny model):
the audit holds every turn, and a SIGKILL in the middle of episodes loses nothing and trains
nothing twice once resumed."""

from __future__ import annotations

import json
import signal
from collections import Counter

import pytest

from planner.ledger_audit import audit
from tests.helpers.cli_runs import launch, lines, trained_steps, untrained_admits, wait_until

STEPS = 6
RUN = ["task=guess_number", "task.max_turns=3", f"steps={STEPS}", "batch_groups=2", "group_size=2",
       "max_new_tokens=8", "engine.max_len=512", "checkpoint_every=2", "max_staleness=1"]


def finish(proc, timeout_s: float = 400) -> str:
    log = proc.communicate(timeout=timeout_s)[0]
    assert proc.returncode == 0, log[-3000:]
    return log


def trained_uids(run_dir) -> Counter:
    return Counter(g["uid"] for e in lines(run_dir / "ledger.jsonl") if e["event"] == "train" for g in e["groups"])


@pytest.mark.slow
def test_a_multi_turn_run_trains_episodes_whose_every_turn_the_audit_checks(tmp_path):
    run_dir = tmp_path / "run"
    finish(launch(run_dir, *RUN))
    report = audit(run_dir, 1)
    assert report.ok and report.steps == STEPS and report.violations == 0 and report.groups_dropped == 0
    groups = [g for e in lines(run_dir / "ledger.jsonl") if e["event"] == "train" for g in e["groups"]]
    assert all(g["turns"] for g in groups)
    assert max(sum(1 for sample, _ in g["turns"] if sample == 0) for g in groups) >= 2  # multi-turn for real
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["episodes"] >= STEPS * 2 * 2 and summary["episode_turns"] > summary["episodes"]
    assert summary["env_tokens"] > 0 and summary["episode_faults"] == 0
    samples = lines(run_dir / "samples.jsonl")
    assert [s["step"] for s in samples] == [step for step in range(STEPS) for _ in range(2)]
    assert all(0 in s["loss_mask"] and s["entry"]["secret"] for s in samples)


@pytest.mark.slow
def test_a_run_killed_mid_episode_and_resumed_loses_nothing_and_trains_nothing_twice(tmp_path):
    run_dir = tmp_path / "run"
    proc = launch(run_dir, *RUN)
    wait_until(proc, lambda: len(trained_steps(run_dir)) >= 3 and untrained_admits(run_dir),
               "step 2 was trained and later groups' episodes were in play")
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=60)
    finish(launch(run_dir, *RUN, "resume=true"))
    report = audit(run_dir, 1)
    assert report.ok and report.steps == STEPS and not report.trained_twice and report.groups_dropped == 0
    assert trained_steps(run_dir) == list(range(STEPS))
    assert set(trained_uids(run_dir).values()) == {1}
    samples = lines(run_dir / "samples.jsonl")
    assert [s["step"] for s in samples] == [step for step in range(STEPS) for _ in range(2)]  # none twice
