"""The report printed at a run's end (jaxrl_async/job/report.py `final_report`)."""

import json

from jaxrl_async.job.report import final_report

OUT = {"run_dir": "/r", "policy": "lookahead", "max_staleness": 1, "steps": 3, "elapsed_s": 30.0,
       "steps_per_hour": 360.0, "steps_skipped": 0, "generator_busy_fraction": 0.5, "trainer_busy_fraction": 0.5,
       "groups_admitted": 6, "groups_trained": 6, "groups_dropped": 0, "tokens_wasted": 0, "reward_errors": 0,
       "max_token_staleness": 1, "mean_token_staleness": 0.5, "staleness_histogram": {"0": 1, "1": 1},
       "completed": True, "audit_verdict": "audit PASS"}


def write_metrics(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_the_held_out_pass_rate_from_the_base_model_to_the_last_evaluation_is_in_the_report(tmp_path):
    metrics = write_metrics(tmp_path / "metrics.jsonl", [
        {"step": 0, "reward_mean": 0.1, "eval/pass_at_1": 0.125, "eval/version": 0},
        {"step": 1, "reward_mean": 0.2},
        {"step": 2, "reward_mean": 0.3, "eval/pass_at_1": 0.5, "eval/version": 2}])
    lines = final_report(OUT, metrics).splitlines()
    assert "eval/pass_at_1 (held out): 0.125 (weights v0) -> 0.500 (v2)" in lines
    assert lines[-1] == "audit PASS"


def test_a_run_without_evaluations_reports_no_eval_line(tmp_path):
    metrics = write_metrics(tmp_path / "metrics.jsonl", [{"step": 0, "reward_mean": 0.1}])
    assert "eval" not in final_report(OUT, metrics)


def test_the_report_gives_the_steady_state_rate_beside_the_whole_run_one(tmp_path):
    metrics = write_metrics(tmp_path / "metrics.jsonl", [{"step": 0, "reward_mean": 0.1}])
    line = final_report({**OUT, "steps_per_hour_steady": 900.0}, metrics).splitlines()[1]
    assert "(360 steps/h; steady state 900, without the compile)" in line
    assert "steady" not in final_report(OUT, metrics)  # a run too short for a steady state


TAIL = {"speculation_drafted_tokens": 300, "speculation_accepted_tokens": 150, "speculation_acceptance": 0.5,
        "speculating_sequences": 90, "groups_migrated": 0}


def test_the_report_says_what_the_tail_features_that_were_on_did_even_nothing(tmp_path):
    metrics = write_metrics(tmp_path / "metrics.jsonl", [{"step": 0, "reward_mean": 0.1}])
    out = {**OUT, **TAIL, "speculation": {"when": "always"}, "policy_params": {"migrate": True}}
    lines = final_report(out, metrics).splitlines()
    assert ("tail: drafted 300 tokens in 90 sequence-iterations, accepted 150 (50%); migrated 0 groups"
            in lines)
    assert lines[-1] == "audit PASS"


def test_a_run_without_the_tail_features_reports_no_tail_line(tmp_path):
    metrics = write_metrics(tmp_path / "metrics.jsonl", [{"step": 0, "reward_mean": 0.1}])
    assert "tail" not in final_report({**OUT, **TAIL, "policy_params": {"migrate": False}}, metrics)
