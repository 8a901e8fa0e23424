"""`python -m planner.tail` prints each figure with its unit and a one-line verdict, or fails in one line."""

import json
import subprocess
import sys

import pytest

from planner.tail_analysis import tail
from planner.tools.tail import main, verdict
from tests.planner.test_tail_analysis import straggler_run, write_real_run


def test_the_command_prints_the_figures_and_refuses_a_directory_without_a_run(tmp_path, capsys):
    write_real_run(tmp_path / "run")
    assert main([str(tmp_path / "run")]) == 0
    out = capsys.readouterr().out
    assert "share of the wait caused by the last 5% of each batch: 70.0%" in out and "prefill unavailable" in out
    (tmp_path / "empty").mkdir()
    done = subprocess.run([sys.executable, "-m", "planner.tail", str(tmp_path / "empty")], capture_output=True,
                          text=True)
    assert done.returncode == 1
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("error: ") and "trace.jsonl" in done.stderr


def test_a_simulated_run_directory_prints_the_tail_its_summary_holds(tmp_path, capsys):
    groups, steps = straggler_run()
    (tmp_path / "summary.json").write_text(json.dumps({"policy": "lookahead", "tail": tail(groups, steps)}))
    assert main([str(tmp_path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["wait_share_last_5pct"] == pytest.approx(7.0 / 11.0)


def test_the_figures_print_with_their_units_and_a_verdict_line(tmp_path, capsys):
    write_real_run(tmp_path / "run")
    assert main([str(tmp_path / "run")]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "trainer waited for batches: 4 s" in lines
    assert "trainer waited, share of the run: 80.0%" in lines
    assert "share of the wait caused by the last 5% of each batch: 70.0%" in lines
    assert "decode time per token, critical groups: p50 0.025 s/token, p99 0.025 s/token" in lines
    assert lines[-1].startswith("verdict: ") and sum(line.startswith("verdict") for line in lines) == 1
    # 0.7 of an 80% wait: 56% of the run; the critical group decodes 2.5 of its 4 s
    assert "keeps the trainer waiting 56% of the run" in lines[-1] and "62% of their 4 s decoding" in lines[-1]


def straggler_tail(**changes):
    t = tail(*straggler_run())
    return {**t, **changes}


def test_a_straggler_that_is_the_longest_group_points_to_speculation():
    line = verdict(straggler_tail())  # its tokens are cheaper than the others': it decodes alone
    assert "would pay" in line and "speculation" in line and "migration" not in line


def test_a_straggler_whose_tokens_cost_more_points_to_migration():
    t = straggler_tail()
    t["decode_s_per_token"] = {"critical": {"p50": 0.09, "p99": 0.1}, "other": {"p50": 0.03, "p99": 0.04}}
    line = verdict(t)
    assert "would pay" in line and "3.0x" in line and "policy.migrate=true" in line


@pytest.mark.parametrize(("wait", "last5", "why"), [
    (0.05, 0.9, "the trainer waits only 5% of the run"),  # trainer-bound
    (0.8, 0.1, "only 10% of the trainer's wait (80% of the run) is the last 5% of each batch"),
])
def test_a_run_the_tail_does_not_bind_says_tail_scheduling_would_not_pay(wait, last5, why):
    line = verdict(straggler_tail(trainer_wait_fraction=wait, wait_share_last_5pct=last5))
    assert "would not pay" in line and why in line


def test_the_verdict_threshold_is_a_tenth_of_the_run():
    assert "would pay" in verdict(straggler_tail(trainer_wait_fraction=0.5, wait_share_last_5pct=0.2))
    assert "would not pay" in verdict(straggler_tail(trainer_wait_fraction=0.5, wait_share_last_5pct=0.19))


def test_a_run_without_a_timing_record_has_no_verdict_to_give():
    t = straggler_tail(groups=0, trainer_wait_fraction=None)
    assert verdict(t).startswith("verdict: no timing record")


def test_a_run_with_episodes_prints_where_their_time_goes_and_one_without_prints_nothing(tmp_path, capsys):
    from tests.planner.test_tail_analysis import write_episodes

    write_episodes(tmp_path / "multi")
    assert main([str(tmp_path / "multi")]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "episodes: 3 (6 model turns, p50 2 / p95 2.9 turns each; ended by an environment fault: 1 timeout)" in lines
    assert "episode time environment: 16 s (55.2%); per turn p50 1.5 s, p95 7 s" in lines
    assert lines[-1].startswith("verdict: ")
    write_real_run(tmp_path / "single")
    assert main([str(tmp_path / "single")]) == 0
    assert "episode" not in capsys.readouterr().out
