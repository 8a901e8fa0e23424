"""The audit recomputes staleness from the ledger alone and fails on every kind of broken promise."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from planner.audit import audit, main
from planner.ledger import LedgerError, LedgerWriter
from planner.types import Admission, Drop


def write(tmp_path, build) -> None:
    with LedgerWriter(tmp_path / "ledger.jsonl") as led:
        build(led)


def clean_run(led: LedgerWriter) -> None:
    led.admit(Admission(0, "p", 0, 1))
    led.admit(Admission(1, "p", 0, 1))
    led.train(0, [(0, [(0, 10)])])
    led.train(1, [(1, [(0, 4), (1, 6)])])


def test_a_clean_run_passes_and_the_histogram_counts_tokens_by_staleness(tmp_path):
    write(tmp_path, clean_run)
    r = audit(tmp_path, max_staleness=1)
    assert r.ok, r.verdict()
    assert r.staleness_histogram == {"0": 16, "1": 4}
    assert r.max_token_staleness == 1 and r.tokens_trained == 20
    assert r.mean_token_staleness == pytest.approx(4 / 20)


def test_a_token_staler_than_eta_is_a_violation(tmp_path):
    write(tmp_path, clean_run)
    r = audit(tmp_path, max_staleness=0)
    assert not r.ok and r.violations == 1


def test_an_admitted_group_never_trained_nor_dropped_is_lost(tmp_path):
    def build(led):
        clean_run(led)
        led.admit(Admission(2, "p", 1, 2))

    write(tmp_path, build)
    r = audit(tmp_path, max_staleness=1)
    assert r.lost == [2] and not r.ok


def test_a_group_trained_twice_fails(tmp_path):
    def build(led):
        clean_run(led)
        led.train(2, [(1, [(1, 6)])])

    write(tmp_path, build)
    r = audit(tmp_path, max_staleness=1)
    assert r.trained_twice == [1] and not r.ok


def test_drops_count_as_waste_not_as_loss(tmp_path):
    def build(led):
        clean_run(led)
        led.admit(Admission(2, "p", 1, None))
        led.drop(Drop(2, 2, "stale"), tokens=33)

    write(tmp_path, build)
    r = audit(tmp_path, max_staleness=1)
    assert r.ok and r.groups_dropped == 1 and r.tokens_wasted == 33 and r.drops_by_reason == {"stale": 1}


def test_tokens_from_the_future_or_before_admission_are_errors(tmp_path):
    def build(led):
        led.admit(Admission(0, "p", 2, None))
        led.train(0, [(0, [(1, 3)])])

    write(tmp_path, build)
    r = audit(tmp_path)
    assert len(r.errors) == 2 and not r.ok


def test_a_readmitted_group_after_a_fault_is_one_group(tmp_path):
    def build(led):
        led.admit(Admission(0, "p", 0, 1))
        led.admit(Admission(0, "p", 1, 2))
        led.train(1, [(0, [(1, 5)])])

    write(tmp_path, build)
    r = audit(tmp_path, max_staleness=0)
    assert r.ok and r.groups_admitted == 1 and r.readmissions == 1


def test_a_malformed_line_names_the_file_and_line(tmp_path):
    (tmp_path / "ledger.jsonl").write_text('{"event": "admit", "uid": 0, "version": 0}\n{not json\n')
    with pytest.raises(LedgerError, match=r"ledger.jsonl:2"):
        audit(tmp_path)
    (tmp_path / "ledger.jsonl").write_text('{"event": "train", "step": 0}\n')
    with pytest.raises(LedgerError, match=r"ledger.jsonl:1: bad 'train' event"):
        audit(tmp_path)


def test_eta_defaults_to_the_summary_and_the_cli_exits_1_on_violation(tmp_path, capsys):
    write(tmp_path, clean_run)
    (tmp_path / "summary.json").write_text(json.dumps({"max_staleness": 0}))
    assert main([str(tmp_path)]) == 1
    assert "audit FAIL" in capsys.readouterr().out
    assert main([str(tmp_path), "--max-staleness", "1"]) == 0


def test_the_cli_reports_a_missing_ledger_in_one_line():
    proc = subprocess.run([sys.executable, "-m", "planner.audit", "/nonexistent"], capture_output=True, text=True)
    assert proc.returncode == 1
    assert proc.stderr.strip().count("\n") == 0 and "no ledger" in proc.stderr
