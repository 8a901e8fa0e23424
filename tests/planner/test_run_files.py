"""planner.run_files: summary.json and metrics.jsonl have the design keys first, from every driver."""

import pytest

from planner import run_files


def test_a_summary_has_the_design_keys_first_then_the_drivers_extensions():
    s = run_files.summary(policy="p", max_staleness=1, staleness_bound=1, steps=4, groups_admitted=9, groups_trained=8, groups_dropped=1,
                          tokens_wasted=5, staleness={0: 10, 1: 30}, elapsed_s=2.0, trainer_busy_s=1.0,
                          generator_busy_s=3.0, record_s=[0.2, 0.5, 1.0, 1.5], extensions={"seed": 0})
    assert list(s) == [*run_files.SUMMARY_KEYS, "seed"]
    assert s["steps_per_hour_steady"] == pytest.approx(3600 / 0.5)  # step 3 over 1.0 -> 1.5 s
    assert s["tokens_trained"] == 40 and s["max_token_staleness"] == 1 and s["mean_token_staleness"] == 0.75
    assert s["generator_busy_fraction"] == 1.0 and s["trainer_busy_fraction"] == 0.5 and s["steps_per_hour"] == 7200


def test_the_steady_state_steps_per_hour_leaves_the_warm_up_steps_out():
    # Steps 0-2 take 10 s (a compile), steps 3-5 take 1 s each: 3600 steps/h steady, not whole-run.
    record_s = [10.0, 11.0, 12.0, 13.0, 14.0, 15.0]
    assert run_files.steady_steps_per_hour(record_s) == pytest.approx(3600.0)
    assert run_files.steady_steps_per_hour(record_s, warmup=1) == pytest.approx(3600.0)
    assert run_files.steady_steps_per_hour(record_s, warmup=0) == pytest.approx(6 / 15 * 3600)
    assert run_files.steady_steps_per_hour(record_s[:3]) is None  # no step after the warm-up


def test_a_step_record_has_the_common_keys_first_and_tokens_per_s_over_the_whole_cycle():
    r = run_files.step_record(step=2, reward_mean=None, loss=None, batch={1: 30, 0: 10}, cycle_s=4.0, wait_s=1.0,
                              start_s=7.0, end_s=8.0, elapsed_s=8.0, trainer_busy_s=4.0, generator_busy_s=6.0,
                              gen_active=(3, -1), kv_usage=0.5, staleness={0: 50, 1: 30}, extensions={"tokens": 40})
    assert list(r) == [*run_files.STEP_KEYS, "tokens"]
    assert r["tokens_per_s"] == 10.0 and r["tokens_trained"] == 40 and r["version"] == 3
    assert r["max_staleness_in_batch"] == 1 and r["mean_staleness_in_batch"] == 0.75
    assert r["trainer_busy"] == 0.5 and r["gen_active"] == [3, -1] and r["staleness_hist"] == {"0": 50, "1": 30}


def test_a_histogram_is_written_with_string_keys_in_ascending_staleness():
    assert list(run_files.hist_json({2: 2, 0: 5, 1: 3}).items()) == [("0", 5), ("1", 3), ("2", 2)]
