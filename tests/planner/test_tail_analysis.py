"""The tail analysis: a hand-built run with a known straggler gives known figures, from records
and from a real run's files."""

import json

import pytest

from planner.ledger import LEDGER_FILE, LedgerWriter
from planner.run_trace import TraceWriter
from planner.tail_analysis import GroupTimes, StepTimes, critical_groups, from_run_dir, tail


def straggler_run():
    """Two steps of 4 groups; in each, one group (uids 3 and 7) needs 100 decode steps at 0.03 s
    and finishes long after the others (10 steps at 0.05 s each)."""
    groups, steps = [], [StepTimes(0, 0.0, 10.0, 12.0), StepTimes(1, 12.0, 13.0, 15.0)]
    finishes = {0: (2.0, 3.0, 4.0, 10.0), 1: (5.0, 6.0, 7.0, 13.0)}
    for step, fs in finishes.items():
        for i, f in enumerate(fs):
            uid = 4 * step + i
            long = i == 3
            n, cost = (100, 0.03) if long else (10, 0.05)
            groups.append(GroupTimes(uid, step, 0, 0.0, 0.5, f, n, n * cost, 0.25, 0.1))
    return groups, steps


def test_a_known_straggler_gives_known_figures():
    groups, steps = straggler_run()
    t = tail(groups, steps)
    assert {s: g.uid for s, g in critical_groups(groups).items()} == {0: 3, 1: 7}
    assert t["groups"] == 8 and t["steps"] == 2
    assert t["trainer_wait_s"] == pytest.approx(11.0)
    assert t["trainer_wait_fraction"] == pytest.approx(11.0 / 15.0)
    # step 0: 10 − max(0, 4) = 6 of its 10 s; step 1: 13 − max(12, 7) = 1 of its 1 s
    assert t["wait_share_last_5pct"] == pytest.approx(7.0 / 11.0)
    assert t["wait_share_last_group"] == pytest.approx(7.0 / 11.0)
    assert t["steps_bound_by_generation"] == 1.0
    assert t["critical_is_longest"] == 1.0 and t["critical_length_rank"] == 1.0
    assert t["decode_s_per_token"]["critical"]["p50"] == pytest.approx(0.03)
    assert t["decode_s_per_token"]["other"]["p50"] == pytest.approx(0.05)
    crit = t["mean_s"]["critical"]
    assert crit["decode_s"] == pytest.approx(3.0) and crit["queue_s"] == pytest.approx(0.5)
    assert crit["trainer_s"] == 0.0  # the batch was handed over at its finish
    # the others: run 1.5 .. 6.5 s − 0.5 decode − 0.25 load − 0.1 prefill; they wait for the trainer
    assert t["mean_s"]["other"]["other_s"] == pytest.approx((1.5 + 2.5 + 3.5 + 4.5 + 5.5 + 6.5) / 6 - 0.85)
    assert t["mean_s"]["other"]["trainer_s"] == pytest.approx((8 + 7 + 6 + 8 + 7 + 6) / 6)


def test_a_batch_whose_groups_were_done_before_the_trainer_was_ready_is_not_bound_by_generation():
    groups = [GroupTimes(u, 0, 0, 0.0, 0.0, f, 10, 0.3, 0.0, 0.0) for u, f in enumerate((1.0, 2.0))]
    t = tail(groups, [StepTimes(0, 5.0, 5.0, 6.0)])
    assert t["steps_bound_by_generation"] == 0.0
    assert t["trainer_wait_s"] == 0.0 and t["wait_share_last_5pct"] is None  # no wait: no share to split


def write_real_run(run_dir):
    """The straggler run as a real run's files: trace (admit/start/finish/load/decode), ledger, metrics."""
    run_dir.mkdir()
    trace, ledger = TraceWriter(run_dir / "trace.jsonl"), LedgerWriter(run_dir / LEDGER_FILE)
    trace.write("run", 0.0, step=0, group_size=1, workers=1, slots=8)
    # drained before the groups start: another stretch's step cost (0.1 s/step), not theirs
    trace.write("decode", 0.2, worker=0, active=1, calls=1, steps=10, tokens=10, prefill_tokens=0, s=1.0)
    lengths = {0: 10, 1: 10, 2: 100}
    for uid in lengths:
        trace.write("admit", 0.0, uid=uid, attempt=0, prompt_id=uid, prompt_tokens=4, version=0)
        trace.write("start", 0.5, uid=uid, attempt=0, version=0, worker=0)
    trace.write("finish", 1.0, uid=0, attempt=0, lengths=[10])
    trace.write("finish", 1.2, uid=1, attempt=0, lengths=[10])
    trace.write("load", 2.0, version=1, worker=0, s=0.5)
    trace.write("finish", 4.0, uid=2, attempt=0, lengths=[100])
    # one drain at the step's end: 100 steps in 2.5 s (0.025 s/step), and a compile left out
    trace.write("decode", 4.1, worker=0, active=2, calls=3, steps=100, tokens=120, prefill_tokens=12, s=2.5)
    trace.write("decode", 4.1, worker=0, active=2, calls=1, steps=8, tokens=16, prefill_tokens=0, s=9.0, compile=True)
    trace.write("train", 4.0, step=0, start=4.0, end=5.0, groups=3, tokens=120, prompt_tokens=12)
    trace.close()
    from planner.types import Admission

    for uid in lengths:
        ledger.admit(Admission(uid=uid, version=0, deadline=1, priority=0.0, prompt_id=uid))
    ledger.train(0, [(uid, [(0, n)]) for uid, n in lengths.items()])
    ledger.close()
    row = {"step": 0, "wait_s": 4.0, "start_s": 4.0, "end_s": 5.0}
    (run_dir / "metrics.jsonl").write_text(json.dumps(row) + "\n")


def test_a_real_runs_files_give_the_critical_group_its_step_cost_and_its_weight_load(tmp_path):
    write_real_run(tmp_path / "run")
    t = from_run_dir(tmp_path / "run")
    assert t["groups"] == 3 and t["steps"] == 1
    crit = t["mean_s"]["critical"]
    assert crit["decode_s"] == pytest.approx(100 * 0.025)  # the compiling line is not a step cost
    assert crit["load_s"] == pytest.approx(0.5)
    assert crit["prefill_s"] is None  # a real trace cannot separate it: unavailable, not invented
    assert crit["other_s"] == pytest.approx(3.5 - 2.5 - 0.5)
    assert t["wait_share_last_group"] == pytest.approx((4.0 - 1.2) / 4.0)
    assert t["decode_s_per_token"]["critical"]["p50"] == pytest.approx(0.025)
    # the run's weight updates: its load lines' seconds; the trace does not record held starts
    assert t["update_load_s"] == pytest.approx(0.5) and t["update_held_s"] is None


# ---------------------------------------------------------------- multi-turn episodes
EPISODES = [  # (uid, sample, turns [[queued_s, gen_s, env_s], ...], fault)
    (0, 0, [[0.5, 2.0, 1.0], [0.0, 1.0, 4.0]], None),
    (0, 1, [[1.5, 3.0, 2.0]], "timeout"),
    (2, 0, [[0.0, 1.0, 0.0], [1.0, 2.0, 8.0], [0.0, 1.0, 1.0]], None),
]


def write_episodes(run_dir):
    """The real run of `write_real_run` with three finished multi-turn episodes in its trace."""
    write_real_run(run_dir)
    trace = TraceWriter(run_dir / "trace.jsonl", append=True)
    for uid, sample, turns, fault in EPISODES:
        trace.write("episode", 3.0, uid=uid, sample=sample, turns=turns, fault=fault)
    trace.close()


def test_episode_lines_split_the_episodes_time_into_waiting_generation_and_environment(tmp_path):
    write_episodes(tmp_path / "run")
    e = from_run_dir(tmp_path / "run")["episodes"]
    assert (e["episodes"], e["turns"], e["faults"]) == (3, 6, {"timeout": 1})
    assert e["total_s"] == pytest.approx({"waiting": 3.0, "generation": 10.0, "environment": 16.0})
    assert e["share"] == pytest.approx({"waiting": 3 / 29, "generation": 10 / 29, "environment": 16 / 29})
    # per turn: environment 1, 4, 2, 0, 8, 1 -> p50 1.5; waiting 0.5, 0, 1.5, 0, 1, 0 -> p50 0.25
    assert e["per_turn_s"]["environment"]["p50"] == pytest.approx(1.5)
    assert e["per_turn_s"]["waiting"]["p50"] == pytest.approx(0.25)
    assert e["per_turn_s"]["generation"]["p95"] == pytest.approx(2.75)
    assert e["turns_per_episode"] == pytest.approx({"p50": 2.0, "p95": 2.9})


def test_a_trace_without_episode_lines_has_no_episodes_section(tmp_path):
    write_real_run(tmp_path / "run")
    assert "episodes" not in from_run_dir(tmp_path / "run")
