"""Held-out evaluation during training (`eval.every`): it reports on the engine's weights, behind
the rollouts, and leaves the ledger and the audit untouched."""

import pytest

from jaxrl_async.engines.base import SampleOutput
from jaxrl_async.runtime.evaluation import EngineEval, EvalScheduler, greedy_sampling, is_eval_request
from jaxrl_async.tasks.base import Prompt
from planner.ledger import LEDGER_FILE, read_ledger
from planner.ledger_audit import audit
from tests.helpers.train_runs import make_job, read_jsonl

RUN = ["steps=6", "batch_groups=2", "group_size=4", "max_new_tokens=6", "eval.every=2", "eval.prompts=3"]


def test_every_kth_step_the_held_out_split_is_scored_on_the_engine_and_the_ledger_never_sees_it(tmp_path):
    summary = make_job(tmp_path, RUN).run()
    records = read_jsonl(tmp_path / "metrics.jsonl")
    evals = [r for r in records if "eval/pass_at_1" in r]
    # The base model before the first step (version 0), then after steps 2 and 4 the engine holds
    # versions 2 and 4 (step 6 is the last: no push, no eval).
    assert [r["eval/version"] for r in evals] == [0, 2, 4]
    assert evals[0]["eval/min_token_version"] == 0 and len(records) == 6  # in a step's record, not a line of its own
    assert all(r["step"] > r["eval/version"] - 1 and r["eval/n"] == 3 for r in evals)
    assert all(r["eval/min_token_version"] >= r["eval/version"] for r in evals)
    assert all(0 <= r["eval/pass_at_1"] <= 1 and 0 <= r["eval/mean_reward"] <= 1 for r in evals)
    assert summary["eval"]["eval/version"] == 4
    uids = {e["uid"] for e in read_ledger(tmp_path / LEDGER_FILE) if "uid" in e}
    assert summary["groups_admitted"] == len(uids) == summary["groups_trained"]  # rollouts only
    report = audit(tmp_path)
    assert report.ok and report.steps == 6 and summary["audit_ok"]


def test_a_task_without_a_held_out_split_fails_at_start_up_in_one_line(tmp_path):
    (tmp_path / "x.jsonl").write_text('{"prompt": "a", "answer": "1"}\n')  # the train split exists
    with pytest.raises(ValueError, match=r"task.test_path=None: split=test needs a held-out JSONL"):
        make_job(tmp_path, ["task=custom", f"task.path={tmp_path / 'x.jsonl'}", "eval.every=5"])


@pytest.mark.parametrize("key, value", [("eval.every", -1), ("eval.prompts", 0)])
def test_bad_eval_settings_name_the_key(tmp_path, key, value):
    with pytest.raises(ValueError, match=key.replace(".", r"\.")):
        make_job(tmp_path, [f"{key}={value}"])


def test_an_evaluation_collects_its_own_pieces_and_ignores_an_earlier_ones():
    prompts = [Prompt(f"p{i}", "", [1, 2], "a", {}) for i in range(2)]
    ev = EngineEval(prompts, 3, greedy_sampling(4, (0,)))
    requests = ev.requests()
    assert [r.request_id for r in requests] == ["eval.3.0", "eval.3.1"] and all(map(is_eval_request, ["eval.3.0"]))
    assert all(r.sampling.temperature == 0 and r.priority > 1e20 for r in requests)  # greedy, behind rollouts

    def piece(rid, tokens, done, version=3):
        return SampleOutput(rid, 0, tokens, [0.0] * len(tokens), [[version, len(tokens)]] if tokens else [],
                            "stop" if done else None, done)

    assert not ev.add(piece("eval.3.0", [5], False))
    assert not ev.add(piece("eval.1.1", [9], True))  # a late piece of an earlier evaluation
    assert not ev.add(piece("eval.3.0", [6], True))
    assert ev.add(piece("eval.3.1", [7], True, version=4))
    assert ev._tokens == [[[5, 6]], [[7]]] and ev.min_version == 3


def scheduler(every: int) -> EvalScheduler:
    return EvalScheduler([Prompt(f"p{i}", "", [1, 2], "a", {}) for i in range(2)], every, max_new_tokens=4,
                         stop_token_ids=(0,))


def test_evaluations_are_due_before_training_and_after_every_kth_step_and_never_when_off():
    assert [s for s in range(7) if scheduler(3).due(s)] == [0, 3, 6]
    assert not any(scheduler(0).due(s) for s in range(7))


def test_one_evaluation_runs_at_a_time_and_its_figures_reach_one_step_record(caplog):
    ev = scheduler(1)
    assert [r.request_id for r in ev.start(0)] == ["eval.0.0", "eval.0.1"]
    assert ev.start(1) == [] and "evaluation of version 1 skipped" in caplog.text  # version 0 still runs
    assert ev.add(SampleOutput("eval.0.0", 0, [5], [0.0], [[0, 1]], "stop", True)) is None
    running = ev.add(SampleOutput("eval.0.1", 0, [5], [0.0], [[0, 1]], "stop", True))
    assert running is ev.running and running.version == 0
    figures = {"eval/pass_at_1": 0.5, "eval/mean_reward": 0.5, "eval/n": 2, "eval/version": 0}
    ev.finished(running, figures)
    assert ev.running is None and ev.last == figures
    assert ev.take_pending() == figures and ev.take_pending() == {} and ev.last == figures
    assert [r.request_id for r in ev.start(2)] == ["eval.2.0", "eval.2.1"]
