"""The runtime's tail hooks: migrations in a real run with two engine replicas, checked by the audit."""

import pytest

from planner.ledger import read_ledger
from planner.ledger_audit import audit
from tests.helpers.tail_policies import MigrateOnFirstTokens
from tests.helpers.train_runs import make_job, read_jsonl

ETA = 1


@pytest.mark.slow
def test_a_two_replica_run_migrates_stragglers_and_the_audit_passes_with_nothing_dropped(tmp_path):
    run_dir = tmp_path / "run"
    job = make_job(run_dir, [f"max_staleness={ETA}", "steps=4", "batch_groups=2", "group_size=2",
                             "max_new_tokens=32", "engine.replicas=2", "engine.colocate=false", "engine.stream_every=2",
                             "engine.decode_steps_per_call=2", "task.lengths=heavy_tail", "task.length_scale=0.25"])
    policy = job.controller.policy = MigrateOnFirstTokens(job.controller.policy)
    summary = job.run()
    events = list(read_ledger(run_dir / "ledger.jsonl"))
    moves = [e for e in events if e["event"] == "migrate"]
    assert policy.named and moves  # the case under test: groups really moved
    assert summary["groups_migrated"] == len(moves) == len({e["uid"] for e in moves})
    assert read_jsonl(run_dir / "metrics.jsonl")[-1]["groups_migrated"] == len(moves)
    trained = {g["uid"]: g["versions"] for e in events if e["event"] == "train" for g in e["groups"]}
    for e in moves:
        assert {e["from"], e["to"]} == {0, 1} and e["versions"]  # moved with a prefix
        have = dict(trained[e["uid"]])
        assert all(have.get(v, 0) >= t for v, t in e["versions"])  # every prefix token trained, same version
    report = audit(run_dir, ETA)
    assert report.ok, report.errors
    assert report.groups_dropped == 0 and not report.lost and report.max_token_staleness <= ETA
    assert summary["audit_ok"]


SHORT = ["steps=3", "batch_groups=2", "group_size=2", "max_new_tokens=16"]
TAIL_KEYS = ("speculation_drafted_tokens", "speculation_accepted_tokens", "speculation_acceptance",
             "speculating_sequences", "groups_migrated")


@pytest.mark.slow
def test_a_run_that_speculates_reports_its_drafted_and_accepted_tokens(tmp_path):
    # max_active = the tests' engine.num_slots: every decode step speculates; the draft is the
    # policy's own first layer, so there is always a draft to verify.
    summary = make_job(tmp_path / "run", SHORT + [
        "engine.speculation.when=always", "engine.speculation.max_active=32", "engine.speculation.method=draft",
        "engine.speculation.draft_model=layers:1"]).run()
    drafted, accepted = summary["speculation_drafted_tokens"], summary["speculation_accepted_tokens"]
    assert drafted > 0 and 0 <= accepted <= drafted, summary
    assert summary["speculation_acceptance"] == pytest.approx(accepted / drafted)
    assert 0 < summary["speculating_sequences"], summary  # the engine counts the sequences that drafted
    assert summary["speculation"]["when"] == "always"
    rows = read_jsonl(tmp_path / "run" / "metrics.jsonl")  # the run so far, at each step, the first included
    assert 0 < rows[0]["speculation_drafted_tokens"] <= rows[-1]["speculation_drafted_tokens"] <= drafted


@pytest.mark.slow
def test_a_default_run_reports_that_nothing_was_drafted_or_migrated(tmp_path):
    summary = make_job(tmp_path / "run", SHORT).run()
    assert {k: summary[k] for k in TAIL_KEYS} == {
        "speculation_drafted_tokens": 0, "speculation_accepted_tokens": 0, "speculation_acceptance": None,
        "speculating_sequences": 0, "groups_migrated": 0}
    assert "speculation" not in summary and summary["policy_params"]["migrate"] is False
