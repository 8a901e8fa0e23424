"""A LoRA run with `engine.adapter_versions=K > 1` (version-pinned generation, engines/jax/
adapter_versions.py): it passes the audit, its groups never mix versions, the trace's `run` line
says "pinned" and summary.json counts what the pushes did; the key warns when it cannot act."""

import logging

from jaxrl_async.job.setup import typed_config
from planner.ledger_audit import audit
from tests.helpers.train_runs import QUIET, compose_train, make_job, read_jsonl, run_within

SMALL = ["steps=5", "batch_groups=2", "group_size=4", "max_new_tokens=6"]


def test_a_pinned_lora_run_passes_the_audit_and_no_group_mixes_versions(tmp_path, caplog):
    run_dir = tmp_path / "run"
    with caplog.at_level(logging.WARNING, logger="jaxrl_async.job.lifecycle"):
        job = make_job(run_dir, [*SMALL, "trainer.lora.rank=4", "engine.adapter_versions=2", "max_staleness=2"])
    # Logged once, by the job (typed_config runs twice on the command line).
    assert [r.getMessage()[:41] for r in caplog.records if "adapter_versions" in r.getMessage()] == [
        "engine.adapter_versions=2 < max_staleness"]
    summary = run_within(job, 600)
    assert summary["completed"] and summary["audit_ok"], summary.get("audit_verdict")
    report = audit(run_dir, 2)
    assert report.ok and not report.lost and not report.trained_twice
    trained = [g for line in read_jsonl(run_dir / "ledger.jsonl") if line["event"] == "train" for g in line["groups"]]
    assert trained and all(len(g["versions"]) == 1 for g in trained), "a group mixed adapter versions"
    assert max(g["versions"][0][0] for g in trained) >= 1  # groups sampled on pushed adapters too
    run_line = next(line for line in read_jsonl(run_dir / "trace.jsonl") if line["event"] == "run")
    assert (run_line["sync_mode"], run_line["adapter_versions"]) == ("pinned", 2)  # what calibrate reads as K
    counts = summary["adapter_versions"]
    assert counts["versions"] == 2 and len(counts["resident"]) == 2
    assert counts["pushes_pinned"] >= 4 and counts["pushes_waited"] >= 0


def test_the_default_run_is_partial_and_counts_no_adapters(tmp_path):
    setup = typed_config(compose_train([*QUIET, *SMALL, "trainer.lora.rank=4"]))
    assert setup.engine_facts.sync_mode == "partial"
    setup = typed_config(compose_train([*QUIET, *SMALL, "trainer.lora.rank=4", "engine.adapter_versions=3"]))
    assert setup.engine_facts.sync_mode == "pinned"


def warnings_of(overrides: list[str]) -> list[str]:
    return typed_config(compose_train([*QUIET, *SMALL, *overrides])).start_warnings()


def test_several_versions_without_lora_warn_that_they_cannot_act():
    lines = warnings_of(["engine.adapter_versions=3"])
    assert len(lines) == 1 and lines[0].startswith("engine.adapter_versions=3 cannot act without LoRA")
    assert warnings_of([]) == [] and warnings_of(["trainer.lora.rank=4"]) == []


def test_fewer_versions_than_the_staleness_window_warn_that_pushes_may_wait():
    lines = warnings_of(["trainer.lora.rank=4", "engine.adapter_versions=2", "max_staleness=2"])
    assert len(lines) == 1 and lines[0].startswith("engine.adapter_versions=2 < max_staleness+1=3")
    assert warnings_of(["trainer.lora.rank=4", "engine.adapter_versions=3", "max_staleness=2"]) == []


def test_zero_versions_is_a_one_line_error_naming_the_key():
    import pytest

    with pytest.raises(ValueError, match=r"^engine.adapter_versions=0: must be an int >= 1") as info:
        typed_config(compose_train([*QUIET, *SMALL, "engine.adapter_versions=0"]))
    assert "\n" not in str(info.value)


def test_migration_with_pinned_versions_warns_that_it_cannot_act():
    lines = warnings_of(["trainer.lora.rank=4", "engine.adapter_versions=3", "max_staleness=2", "policy.migrate=true"])
    assert len(lines) == 1 and lines[0].startswith("policy.migrate=true cannot act with engine.adapter_versions=3")
