"""The audit recomputes staleness from the ledger alone and fails on every kind of broken promise.

One minimal failing ledger per rule of `planner/ledger_audit.py` (docs/design.md §8.2), each asserting
that specific finding, next to the boundary case that passes. A new rule in the audit gets its
fixture here.
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from planner.ledger import LedgerError, LedgerWriter
from planner.ledger_audit import audit
from planner.length_bias import ks_statistic, length_bias
from planner.tools.audit import main
from planner.types import Admission, Drop, Move

# ---------------------------------------------------------------- raw ledger lines


def admit(uid, version=0, deadline=None):
    return {"event": "admit", "uid": uid, "version": version, "deadline": deadline}


def train(step, groups):
    """groups: {uid: [(version, tokens), ...]}"""
    return {"event": "train", "step": step,
            "groups": [{"uid": u, "versions": [list(r) for r in runs]} for u, runs in groups.items()]}


def drop(uid, step=0, tokens=0, reason="stale", **extra):
    return {"event": "drop", "uid": uid, "step": step, "reason": reason, "tokens": tokens, **extra}


def write_ledger(run_dir, *events, metrics_steps=None, summary=None):
    """A run dir holding exactly these ledger events (and, optionally, metrics.jsonl / summary.json)."""
    (run_dir / "ledger.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    if metrics_steps is not None:
        (run_dir / "metrics.jsonl").write_text("".join(json.dumps({"step": s}) + "\n" for s in metrics_steps))
    if summary is not None:
        (run_dir / "summary.json").write_text(json.dumps(summary))
    return run_dir


CLEAN = (admit(0), admit(1), train(0, {0: [(0, 10)]}), train(1, {1: [(0, 4), (1, 6)]}))


def only_error(report, text):
    """The report fails on exactly one structural error, and it says `text`."""
    assert not report.ok
    assert len(report.errors) == 1 and text in report.errors[0], report.errors
    assert not report.lost and not report.trained_twice and not report.violations


# ---------------------------------------------------------------- what a clean run reports


def test_a_clean_run_passes_and_the_report_counts_every_event(tmp_path):
    with LedgerWriter(tmp_path / "ledger.jsonl") as led:
        led.admit(Admission(0, "p", 0, 1))
        led.admit(Admission(1, "p", 0, 1))
        led.admit(Admission(1, "p", 0, 1))  # a re-admission after a fault
        led.start(0, 0)
        led.move(Move(0, -1, 0))
        led.train(0, [(0, [(0, 10)])])
        led.train(1, [(1, [(0, 4), (1, 6)])])
        led.admit(Admission(2, "p", 1, None))
        led.drop(Drop(2, 2, "stale"), tokens=33)
    r = audit(tmp_path, max_staleness=1)
    assert r.ok and r.errors == [], r.verdict()
    assert (r.steps, r.groups_admitted, r.readmissions, r.groups_trained, r.groups_dropped, r.moves) == (2, 3, 1, 2, 1, 1)
    assert r.staleness_histogram == {"0": 16, "1": 4}
    assert r.max_token_staleness == 1 and r.tokens_trained == 20 and r.tokens_wasted == 33
    assert r.mean_token_staleness == pytest.approx(4 / 20)
    assert r.drops_by_reason == {"stale": 1}
    assert r.verdict().startswith("audit PASS: 2 steps, 2 groups trained, max staleness 1 (η=1), 0 violations, 1 dropped")


def test_the_counters_add_up_every_readmission_move_drop_and_violation(tmp_path):
    # Each counter sees two or more events, so a counter that is set instead of summed fails.
    write_ledger(tmp_path, admit(0), admit(1), admit(2), admit(3), admit(4),
                 admit(1, 0), admit(1, 0),  # two re-admissions of uid 1
                 {"event": "move", "uid": 0, "from": -1, "to": 0}, {"event": "move", "uid": 1, "from": -1, "to": 1},
                 {"event": "start", "uid": 0, "version": 0},
                 train(0, {0: [(0, 4)]}), drop(2, tokens=5), train(1, {}), train(2, {1: [(0, 3), (2, 1)]}),
                 drop(3, tokens=7, reason="end_of_run"), train(3, {4: [(1, 2)]}), admit(5, 3), drop(5, tokens=11))
    r = audit(tmp_path, 1)
    assert (r.groups_admitted, r.readmissions, r.moves, r.groups_trained) == (6, 2, 2, 3)
    assert (r.groups_dropped, r.tokens_wasted, r.drops_by_reason) == (3, 23, {"stale": 2, "end_of_run": 1})
    assert (r.violations, r.max_token_staleness, r.tokens_trained) == (2, 2, 10)  # uid 1 (staleness 2), uid 4 (2)
    assert r.staleness_histogram == {"0": 5, "2": 5} and r.mean_token_staleness == pytest.approx(10 / 10)
    assert r.verdict() == ("audit FAIL: 4 steps, 3 groups trained, max staleness 2 (η=1), 2 violations, 3 dropped, "
                           "0 lost, 0 trained twice, length bias KS 0.500 (trained/admitted mean length 0.606)")


def test_a_drop_without_tokens_or_reason_wastes_nothing_and_counts_under_an_empty_reason(tmp_path):
    # Both fields are optional to the audit (ledgers of older runs lack them); the drop still counts.
    write_ledger(tmp_path, admit(0), admit(1), train(0, {0: [(0, 6)]}), {"event": "drop", "uid": 1, "step": 1})
    r = audit(tmp_path, 0)
    assert r.ok and (r.groups_dropped, r.tokens_wasted, r.drops_by_reason) == (1, 0, {"": 1}), r.verdict()
    assert r.length_bias["mean_length_ratio"] == pytest.approx(6 / 3)  # the drop's length: 0 tokens generated


def test_the_audit_takes_the_ledger_file_itself_and_reads_the_summary_next_to_it(tmp_path):
    write_ledger(tmp_path, *CLEAN, summary={"max_staleness": 0})
    r = audit(tmp_path / "ledger.jsonl")
    assert r.max_staleness == 0 and r.violations == 1 and r.steps == 2 and r.errors == [], r.verdict()


# ---------------------------------------------------------------- the staleness bound


@pytest.mark.parametrize("eta", [0, 1, 2])
def test_staleness_equal_to_eta_passes_and_eta_plus_one_fails(tmp_path, eta):
    # Step k trains uid k, generated on v0: staleness k. The worst is eta + 1 at the last step.
    events = [admit(u) for u in range(eta + 2)] + [train(k, {k: [(0, 5)]}) for k in range(eta + 2)]
    write_ledger(tmp_path, *events)
    passing = audit(tmp_path, max_staleness=eta + 1)
    assert passing.ok and passing.violations == 0 and passing.max_token_staleness == eta + 1, passing.verdict()
    failing = audit(tmp_path, max_staleness=eta)
    assert not failing.ok and failing.violations == 1 and failing.errors == [], failing.verdict()


def test_a_group_counts_once_however_many_of_its_tokens_are_too_stale(tmp_path):
    write_ledger(tmp_path, admit(0), admit(1), train(0, {0: [(0, 1)]}), train(1, {1: [(0, 3), (1, 2)]}),
                 train(2, {}))
    r = audit(tmp_path, max_staleness=0)
    assert r.violations == 1 and r.max_token_staleness == 1


def test_a_run_of_zero_tokens_has_no_staleness(tmp_path):
    # The driver may report an empty version run; no token was trained on it.
    write_ledger(tmp_path, admit(0), train(0, {}), train(1, {0: [(0, 0), (1, 7)]}))
    r = audit(tmp_path, max_staleness=0)
    assert r.ok and r.max_token_staleness == 0 and r.staleness_histogram == {"0": 7, "1": 0}, r.verdict()


def test_without_eta_only_the_structure_is_checked(tmp_path):
    write_ledger(tmp_path, admit(0), train(0, {}), train(1, {}), train(2, {0: [(0, 5)]}))
    r = audit(tmp_path)
    assert r.ok and r.max_staleness is None and r.max_token_staleness == 2, r.verdict()
    assert "max staleness 2 (unbounded), 0 violations" in r.verdict()


# ---------------------------------------------------------------- groups: lost, twice, unknown


def test_an_admitted_group_never_trained_nor_dropped_is_lost(tmp_path):
    write_ledger(tmp_path, *CLEAN, admit(2, 1))
    r = audit(tmp_path, max_staleness=1)
    assert r.lost == [2] and not r.ok and r.errors == [] and "1 lost" in r.verdict()


def test_a_group_trained_in_two_steps_is_trained_twice(tmp_path):
    write_ledger(tmp_path, *CLEAN, train(2, {1: [(1, 6)]}))
    r = audit(tmp_path, max_staleness=2)
    assert r.trained_twice == [1] and not r.ok and r.errors == [] and r.groups_trained == 2


def test_a_group_named_twice_in_one_batch_is_trained_twice(tmp_path):
    write_ledger(tmp_path, admit(0), admit(1), {"event": "train", "step": 0, "groups": [
        {"uid": 0, "versions": [[0, 3]]}, {"uid": 0, "versions": [[0, 3]]}, {"uid": 1, "versions": [[0, 2]]}]})
    r = audit(tmp_path, max_staleness=0)
    assert r.trained_twice == [0] and not r.ok and r.tokens_trained == 5
    assert r.groups_trained == 2 and r.lost == [], "the batch's next group is still trained"


def test_a_group_trained_but_never_admitted_is_an_error(tmp_path):
    r = audit(write_ledger(tmp_path, admit(0), train(0, {7: [(0, 3)], 0: [(0, 2)]})), 0)
    only_error(r, "line 2: uid 7 trained but never admitted")
    assert r.groups_trained == 1 and r.tokens_trained == 2, "the batch's next group is still trained"


def test_a_group_trained_after_its_drop_is_an_error(tmp_path):
    only_error(audit(write_ledger(tmp_path, admit(0), admit(1), drop(0), train(0, {0: [(0, 3)], 1: [(0, 3)]})), 0),
               "uid 0 trained but never admitted (or after a drop)")


@pytest.mark.parametrize("closing", ["trained", "dropped"])
def test_a_group_admitted_after_it_was_closed_is_an_error(tmp_path, closing):
    close = train(0, {0: [(0, 3)]}) if closing == "trained" else drop(0)
    steps = [] if closing == "trained" else [train(0, {})]
    r = audit(write_ledger(tmp_path, admit(0), *steps, close, admit(0, 1), admit(1, 1), train(1, {1: [(1, 2)]})), 1)
    only_error(r, f"uid 0 admitted after it was {closing}")
    assert r.groups_admitted == 2 and r.readmissions == 0, "the ledger is read past the finding"
    assert r.groups_trained == (2 if closing == "trained" else 1) and r.steps == 2


@pytest.mark.parametrize("case", ["never admitted", "after its training", "twice"])
def test_a_drop_of_a_group_that_is_not_open_is_an_error(tmp_path, case):
    events = {"never admitted": [train(0, {}), drop(5)],
              "after its training": [admit(5), train(0, {5: [(0, 1)]}), drop(5)],
              "twice": [admit(5), train(0, {}), drop(5), drop(5)]}[case]
    r = audit(write_ledger(tmp_path, *events, admit(6, 1), train(1, {6: [(1, 2)]})), 0)
    only_error(r, "uid 5 dropped but not open")
    assert r.groups_dropped == (1 if case == "twice" else 0)
    assert r.groups_trained == (2 if case == "after its training" else 1), "the ledger is read past the finding"


# ---------------------------------------------------------------- token versions and steps


def test_tokens_from_a_version_newer_than_the_step_are_an_error(tmp_path):
    only_error(audit(write_ledger(tmp_path, admit(0), train(0, {0: [(1, 3)]}))), "version 1 > step 0")


def test_tokens_from_a_version_equal_to_the_step_pass(tmp_path):
    assert audit(write_ledger(tmp_path, admit(0), train(0, {}), train(1, {0: [(1, 3)]})), 0).ok


def test_tokens_older_than_the_admission_are_an_error(tmp_path):
    only_error(audit(write_ledger(tmp_path, admit(0, 1), train(0, {}), train(1, {}), train(2, {0: [(0, 3)]}))),
               "version 0 < admission 1")


def test_the_latest_readmission_is_the_start_barrier(tmp_path):
    # Admitted on v0, re-admitted on v2 after a fault: a token of v1 broke the barrier.
    events = [admit(0, 0), train(0, {}), train(1, {}), admit(0, 2), train(2, {0: [(1, 3), (2, 1)]})]
    r = audit(write_ledger(tmp_path, *events))
    only_error(r, "version 1 < admission 2")
    assert r.readmissions == 1 and r.groups_admitted == 1
    ok = audit(write_ledger(tmp_path, *events[:-1], train(2, {0: [(2, 4)]})), 0)
    assert ok.ok, ok.verdict()


def test_a_negative_token_count_is_an_error(tmp_path):
    only_error(audit(write_ledger(tmp_path, admit(0), train(0, {0: [(0, -3)]}))), "-3 tokens of version 0")


def test_a_step_trained_twice_is_an_error(tmp_path):
    only_error(audit(write_ledger(tmp_path, admit(0), admit(1), train(0, {0: [(0, 2)]}), train(0, {1: [(0, 2)]}))),
               "step 0 trained twice")


@pytest.mark.parametrize(("steps", "first_bad"), [([1], 1), ([0, 2], 2), ([0, 1, 3], 3)])
def test_steps_must_run_from_0_without_a_gap(tmp_path, steps, first_bad):
    r = audit(write_ledger(tmp_path, *[train(s, {}) for s in steps]))
    only_error(r, f"step {first_bad} follows {steps.index(first_bad)} trained steps")
    assert r.steps == len(steps)


def test_steps_out_of_order_are_an_error(tmp_path):
    r = audit(write_ledger(tmp_path, train(1, {}), train(0, {})))
    assert len(r.errors) == 2 and "step 1 follows 0" in r.errors[0] and "step 0 follows 1" in r.errors[1]


# ---------------------------------------------------------------- malformed ledgers


def test_an_unknown_event_is_an_error(tmp_path):
    only_error(audit(write_ledger(tmp_path, *CLEAN, {"event": "teleport", "uid": 0}), 1), "line 5: unknown event 'teleport'")


def test_a_line_that_is_not_json_names_the_file_and_line(tmp_path):
    (tmp_path / "ledger.jsonl").write_text('{"event": "admit", "uid": 0, "version": 0}\n{not json\n')
    with pytest.raises(LedgerError, match=r"ledger.jsonl:2: not valid JSON"):
        audit(tmp_path)


@pytest.mark.parametrize("line", ['{"uid": 0}', "[1, 2]"])
def test_a_line_without_an_event_names_the_file_and_line(tmp_path, line):
    (tmp_path / "ledger.jsonl").write_text(json.dumps(admit(0)) + "\n" + line + "\n")
    with pytest.raises(LedgerError, match=r"ledger.jsonl:2: missing field 'event'"):
        audit(tmp_path)


@pytest.mark.parametrize(
    ("event", "kind"),
    [
        ({"event": "admit", "version": 0}, "admit"),
        ({"event": "admit", "uid": 0}, "admit"),
        ({"event": "admit", "uid": "zero", "version": 0}, "admit"),
        ({"event": "train", "groups": []}, "train"),
        ({"event": "train", "step": 0}, "train"),
        ({"event": "train", "step": 0, "groups": [{"versions": [[0, 1]]}]}, "train"),
        ({"event": "train", "step": 0, "groups": [{"uid": 0}]}, "train"),
        ({"event": "train", "step": 0, "groups": [{"uid": 0, "versions": [[0]]}]}, "train"),
        ({"event": "train", "step": 0, "groups": [{"uid": 0, "versions": [[0, "many"]]}]}, "train"),
        ({"event": "drop", "step": 0}, "drop"),
        ({"event": "drop", "uid": 0, "tokens": "some"}, "drop"),
        ({"event": "drop", "uid": 0, "tokens": 1, "length": "long"}, "drop"),
        ({"event": "move", "uid": 0, "from": 1}, "move"),
        ({"event": "move", "from": 1, "to": 2}, "move"),
        ({"event": "start", "uid": 0}, "start"),
        ({"event": "start", "version": 0}, "start"),
    ],
)
def test_a_missing_or_malformed_field_names_the_line_and_the_event(tmp_path, event, kind):
    (tmp_path / "ledger.jsonl").write_text(json.dumps(admit(0)) + "\n" + json.dumps(event) + "\n")
    with pytest.raises(LedgerError, match=rf"ledger.jsonl:2: bad '{kind}' event \((KeyError|TypeError|ValueError): "):
        audit(tmp_path)


# ---------------------------------------------------------------- an empty or short ledger


@pytest.mark.parametrize("text", ["", "\n\n"])
def test_an_empty_ledger_fails(tmp_path, text):
    (tmp_path / "ledger.jsonl").write_text(text)
    r = audit(tmp_path, 1)
    only_error(r, "the ledger is empty")
    assert "FAIL" in r.verdict()


@pytest.mark.parametrize(("claim", "steps"), [("metrics", 2), ("summary", 2), ("summary", 1)])
def test_a_ledger_without_a_train_event_fails_when_the_run_says_it_trained(tmp_path, claim, steps):
    r = audit(write_ledger(tmp_path, admit(0), drop(0), metrics_steps=list(range(steps)) if claim == "metrics" else None,
                           summary={"steps": steps} if claim == "summary" else None), 1)
    only_error(r, f"no train event, but metrics.jsonl / summary.json say {steps} steps were trained")


def test_a_ledger_without_a_train_event_passes_when_nothing_was_trained(tmp_path):
    r = audit(write_ledger(tmp_path, admit(0), drop(0, reason="end_of_run"), metrics_steps=[], summary={"steps": 0}))
    assert r.ok and r.steps == 0, r.verdict()


def test_a_ledger_that_stops_short_of_the_metrics_fails(tmp_path):
    r = audit(write_ledger(tmp_path, *CLEAN, metrics_steps=[0, 1, 2, 3]), 1)
    only_error(r, "stops short of metrics.jsonl: steps 2, 3 have a metrics record and no train event")


@pytest.mark.parametrize(("last", "shown"), [(6, "2, 3, 4, 5, 6 have"), (7, "2, 3, 4, 5, 6, ... have")])
def test_the_steps_missing_from_the_ledger_are_named_up_to_five(tmp_path, last, shown):
    r = audit(write_ledger(tmp_path, *CLEAN, metrics_steps=range(last + 1)), 1)
    only_error(r, f"stops short of metrics.jsonl: steps {shown} a metrics record")


def test_blank_lines_in_the_metrics_are_skipped_not_the_end(tmp_path):
    write_ledger(tmp_path, *CLEAN)
    (tmp_path / "metrics.jsonl").write_text('{"step": 0}\n\n  \n{"step": 1}\n{"step": 2}\n')
    only_error(audit(tmp_path, 1), "steps 2 have a metrics record and no train event")


@pytest.mark.parametrize("steps", [None, True, "2", 2.0])
def test_a_summary_step_count_that_is_not_an_integer_claims_nothing(tmp_path, steps):
    r = audit(write_ledger(tmp_path, admit(0), drop(0), summary={"steps": steps}), 1)
    assert r.ok and r.errors == [], r.verdict()


def test_a_ledger_that_trains_every_metrics_step_passes(tmp_path):
    # A resumed run may have repeated a metrics record; every step is still in the ledger.
    r = audit(write_ledger(tmp_path, *CLEAN, metrics_steps=[0, 1, 1], summary={"steps": 2, "max_staleness": 1}))
    assert r.ok and r.max_staleness == 1, r.verdict()


def test_a_ledger_that_stops_short_of_the_summary_fails(tmp_path):
    only_error(audit(write_ledger(tmp_path, *CLEAN, summary={"steps": 3}), 1),
               "stops short of summary.json: it says 3 steps, the ledger trains 2")


def test_an_unreadable_metrics_record_is_an_error_naming_its_line(tmp_path):
    write_ledger(tmp_path, *CLEAN)
    (tmp_path / "metrics.jsonl").write_text('{"step": 0}\n{"step": 1, "loss": 0.\n')
    only_error(audit(tmp_path, 1), "metrics.jsonl:2: unreadable metrics record (JSONDecodeError: ")


def test_an_unreadable_summary_names_the_file(tmp_path):
    write_ledger(tmp_path, *CLEAN)
    (tmp_path / "summary.json").write_text('{"steps": ')
    with pytest.raises(LedgerError, match=r"summary.json: not valid JSON"):
        audit(tmp_path)


def test_a_summary_that_is_not_an_object_names_the_file_and_what_it_holds(tmp_path):
    write_ledger(tmp_path, *CLEAN, summary=[{"steps": 2}])
    with pytest.raises(LedgerError, match=r"summary.json: expected a JSON object, got list$"):
        audit(tmp_path)


# ---------------------------------------------------------------- the length-bias certificate


def test_length_bias_compares_admitted_and_trained_group_lengths(tmp_path):
    # Admitted lengths 10, 10, 100, 100; the two long ones dropped: trained 10, 10.
    write_ledger(tmp_path, admit(0), admit(1), admit(2), admit(3), train(0, {0: [(0, 10)], 1: [(0, 4), (0, 6)]}),
                 drop(2, tokens=100), drop(3, tokens=60, length=100))
    r = audit(tmp_path, 0)
    assert r.length_bias == {"ks": pytest.approx(0.5), "mean_length_ratio": pytest.approx(10 / 55)}
    assert "length bias KS 0.500 (trained/admitted mean length 0.182)" in r.verdict()


def test_a_drop_without_a_length_counts_its_generated_tokens_and_a_lost_group_counts_zero(tmp_path):
    write_ledger(tmp_path, admit(0), admit(1), admit(2), train(0, {0: [(0, 10)]}), drop(1, tokens=30))
    assert audit(tmp_path).length_bias["mean_length_ratio"] == pytest.approx(10 / ((10 + 30 + 0) / 3))
    write_ledger(tmp_path, admit(0), admit(1), admit(2), train(0, {0: [(0, 10)]}), drop(1, tokens=30, length=50))
    r = audit(tmp_path)
    assert r.lost == [2] and r.length_bias["mean_length_ratio"] == pytest.approx(10 / 20)  # (10 + 50 + 0) / 3
    assert r.length_bias["ks"] == pytest.approx(1 / 3)  # F_admitted(0) = 1/3, F_trained(0) = 0; at 10: 2/3 vs 1


def test_a_run_without_drops_has_no_length_bias(tmp_path):
    r = audit(write_ledger(tmp_path, *CLEAN), 1)
    assert r.length_bias == {"ks": 0.0, "mean_length_ratio": 1.0}


def test_a_run_that_trained_nothing_has_no_length_bias_figures(tmp_path):
    r = audit(write_ledger(tmp_path, admit(0), drop(0, tokens=4)))
    assert r.length_bias == {"ks": None, "mean_length_ratio": None} and "length bias" not in r.verdict()


def test_a_length_bias_at_the_limit_passes_and_above_it_fails(tmp_path):
    write_ledger(tmp_path, admit(0), admit(1), train(0, {0: [(0, 10)]}), drop(1, tokens=90))
    assert audit(tmp_path, 0).length_bias["ks"] == pytest.approx(0.5)
    assert audit(tmp_path, 0, max_length_bias=0.5).ok
    r = audit(tmp_path, 0, max_length_bias=0.49)
    assert not r.ok and r.length_bias_exceeded and r.errors == [] and "> 0.49" in r.verdict()


def test_ks_statistic_matches_scipy():
    stats = pytest.importorskip("scipy.stats")
    rng = np.random.default_rng(0)
    for _ in range(50):
        a = rng.integers(0, 20, size=rng.integers(1, 40))  # small integers: many ties
        b = rng.integers(0, 25, size=rng.integers(1, 40))
        assert ks_statistic(a, b) == pytest.approx(stats.ks_2samp(a, b).statistic, abs=1e-12)
    a = rng.pareto(1.5, 500)
    assert ks_statistic(a, a[a < 3]) == pytest.approx(stats.ks_2samp(a, a[a < 3]).statistic, abs=1e-12)


def test_ks_statistic_extremes_and_empty_samples():
    assert ks_statistic([1, 2, 3], [1, 2, 3]) == 0.0
    assert ks_statistic([1, 2], [5, 6]) == 1.0
    assert length_bias([], [1]) == {"ks": None, "mean_length_ratio": None}
    with pytest.raises(ValueError, match="non-empty"):
        ks_statistic([], [1])


# ---------------------------------------------------------------- the command line


def test_eta_defaults_to_the_summary_and_the_cli_exits_1_on_violation(tmp_path, capsys):
    write_ledger(tmp_path, *CLEAN, summary={"max_staleness": 0})
    assert main([str(tmp_path)]) == 1
    assert "audit FAIL" in capsys.readouterr().out
    assert main([str(tmp_path), "--max-staleness", "1"]) == 0


def test_the_cli_fails_on_length_bias_above_the_limit_and_prints_it_as_json(tmp_path, capsys):
    write_ledger(tmp_path, admit(0), admit(1), train(0, {0: [(0, 10)]}), drop(1, tokens=90))
    assert main([str(tmp_path), "--max-length-bias", "0.5", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["length_bias"] == {"ks": 0.5, "mean_length_ratio": pytest.approx(10 / 50)} and report["ok"]
    assert main([str(tmp_path), "--max-length-bias", "0.4"]) == 1
    assert "audit FAIL" in capsys.readouterr().out
    assert main([str(tmp_path), "--max-length-bias", "1.5"]) == 2
    assert "--max-length-bias=1.5: must be in [0, 1]" in capsys.readouterr().err


def test_the_cli_reports_a_missing_ledger_in_one_line():
    proc = subprocess.run([sys.executable, "-m", "planner.audit", "/nonexistent"], capture_output=True, text=True)
    assert proc.returncode == 1
    assert proc.stderr.strip().count("\n") == 0 and "no ledger" in proc.stderr


def test_the_cli_reports_an_empty_ledger_as_a_failure(tmp_path):
    (tmp_path / "ledger.jsonl").write_text("")
    proc = subprocess.run([sys.executable, "-m", "planner.audit", str(tmp_path)], capture_output=True, text=True)
    assert proc.returncode == 1 and "audit FAIL" in proc.stdout and "the ledger is empty" in proc.stdout


def test_the_cli_json_is_one_object_holding_every_report_field_and_the_verdict(tmp_path, capsys):
    write_ledger(tmp_path, *CLEAN, admit(2, 1), drop(2, tokens=5), summary={"max_staleness": 1})
    assert main([str(tmp_path), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)  # nothing but the object: it pipes into jq
    verdict = report.pop("verdict")
    assert report == {
        "max_staleness": 1, "max_length_bias": None, "steps": 2, "groups_admitted": 3, "groups_trained": 2,
        "groups_dropped": 1, "readmissions": 0, "moves": 0, "migrations": 0, "episodes": 0, "turns": 0,
        "tokens_trained": 20, "tokens_wasted": 5,
        "max_token_staleness": 1, "mean_token_staleness": 0.2, "staleness_histogram": {"0": 16, "1": 4},
        "violations": 0, "lost": [], "trained_twice": [], "errors": [], "drops_by_reason": {"stale": 1},
        "length_bias": {"ks": pytest.approx(1 / 3), "mean_length_ratio": pytest.approx(10 / (25 / 3))}, "ok": True}
    assert verdict.startswith("audit PASS: 2 steps, 2 groups trained, max staleness 1 (η=1), 0 violations, 1 dropped")


def test_the_cli_prints_only_the_verdict_without_json(tmp_path, capsys):
    write_ledger(tmp_path, *CLEAN)
    assert main([str(tmp_path), "--max-staleness", "1"]) == 0
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and out.startswith("audit PASS: 2 steps")


@pytest.mark.parametrize(("flag", "value", "message"), [
    ("--max-staleness", "-1", "error: --max-staleness=-1: must be >= 0"),
    ("--max-length-bias", "-0.1", "error: --max-length-bias=-0.1: must be in [0, 1] (a KS statistic)"),
    ("--max-length-bias", "1.01", "error: --max-length-bias=1.01: must be in [0, 1] (a KS statistic)"),
])
def test_the_cli_rejects_a_limit_out_of_range_with_exit_2_and_one_line(tmp_path, capsys, flag, value, message):
    write_ledger(tmp_path, *CLEAN)
    assert main([str(tmp_path), flag, value]) == 2
    out, err = capsys.readouterr()
    assert err == message + "\n" and out == ""


@pytest.mark.parametrize(("flag", "value"), [("--max-staleness", "0"), ("--max-length-bias", "0"),
                                             ("--max-length-bias", "1")])
def test_the_cli_accepts_the_limits_at_the_ends_of_their_range(tmp_path, capsys, flag, value):
    write_ledger(tmp_path, admit(0), admit(1), train(0, {0: [(0, 5)], 1: [(0, 2)]}))  # staleness 0, KS 0
    assert main([str(tmp_path), flag, value]) == 0
    assert capsys.readouterr().out.startswith("audit PASS")


@pytest.mark.parametrize(("ledger", "message"), [
    (None, "{dir}/ledger.jsonl: no ledger (expected ledger.jsonl in the run directory)"),
    ('{"event": "admit", "uid": 0, "version": 0}\n{not json\n', "{dir}/ledger.jsonl:2: not valid JSON"),
    ('{"event": "drop"}\n', "{dir}/ledger.jsonl:1: bad 'drop' event (KeyError: 'uid')"),
])
def test_the_cli_reports_an_unreadable_ledger_in_one_line_on_stderr_with_exit_1(tmp_path, capsys, ledger, message):
    if ledger is not None:
        (tmp_path / "ledger.jsonl").write_text(ledger)
    assert main([str(tmp_path)]) == 1
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and err.startswith("error: " + message.format(dir=tmp_path)), err


def test_the_cli_help_names_the_command_and_says_what_each_option_does(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--help"])
    assert exit_.value.code == 0
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps to the terminal's width
    assert text.startswith("usage: python -m planner.audit [-h] ")
    for said in ["Independent audit of a run: recompute every staleness claim from `ledger.jsonl` alone.",
                 "run_dir run directory holding ledger.jsonl (or the ledger file itself)",
                 "--max-staleness MAX_STALENESS η to check (default: summary.json's)",
                 "--max-length-bias MAX_LENGTH_BIAS fail when the KS statistic of admitted vs trained group lengths "
                 "exceeds this",
                 "--json print the full report as JSON"]:
        assert said in text, said


# ---------------------------------------------------------------- migrate lines (docs/design.md §2.14)


def migrate(uid, versions, src=0, dst=1):
    return {"event": "migrate", "uid": uid, "from": src, "to": dst, "versions": [list(v) for v in versions]}


def test_a_migration_that_keeps_its_prefix_passes(tmp_path):
    report = audit(write_ledger(tmp_path, admit(0), admit(1), migrate(0, [(0, 3)]), train(0, {1: [(0, 1)]}),
                                migrate(0, [(0, 3), (1, 2)], 1, 2), train(1, {0: [(0, 3), (1, 5)]})), 1)
    assert report.ok, report.verdict()
    assert report.migrations == 2


def test_a_migration_of_a_group_that_is_not_open_fails(tmp_path):
    only_error(audit(write_ledger(tmp_path, admit(0), migrate(7, [(0, 3)]), train(0, {0: [(0, 4)]}))),
               "uid 7 migrated but not open (never admitted)")
    trained_first = tmp_path / "trained"
    trained_first.mkdir()
    only_error(audit(write_ledger(trained_first, admit(0), train(0, {0: [(0, 4)]}), migrate(0, [(0, 4)]))),
               "uid 0 migrated but not open (trained)")


def test_a_trained_group_missing_prefix_tokens_fails(tmp_path):
    only_error(audit(write_ledger(tmp_path, admit(0), migrate(0, [(0, 3)]), train(0, {0: [(0, 2)]}))),
               "version 0: 2 < 3")


def test_a_re_versioned_prefix_fails(tmp_path):
    # Same token count, but the 3 prefix tokens of version 0 came back as version 1.
    only_error(audit(write_ledger(tmp_path, admit(0), admit(1), migrate(0, [(0, 3)]), train(0, {1: [(0, 1)]}),
                                  train(1, {0: [(1, 5)]}))),
               "version 0: 0 < 3")


def test_a_later_migration_that_lost_an_earlier_prefix_fails(tmp_path):
    only_error(audit(write_ledger(tmp_path, admit(0), migrate(0, [(0, 3)]), migrate(0, [(0, 1)], 1, 2),
                                  train(0, {0: [(0, 3)]}))),
               "migrated without the prefix its earlier migration moved")


def test_a_dropped_group_with_fewer_tokens_than_its_migrated_prefix_fails(tmp_path):
    only_error(audit(write_ledger(tmp_path, admit(0), migrate(0, [(0, 3)]), drop(0, tokens=2), admit(1),
                                  train(0, {1: [(0, 1)]}))),
               "dropped with 2 tokens, fewer than the 3")


def test_a_regenerated_group_owes_nothing_to_its_earlier_migration(tmp_path):
    # A re-admission (fault, regenerate) starts a new attempt: the old prefix may be discarded.
    report = audit(write_ledger(tmp_path, admit(0), migrate(0, [(0, 3)]), admit(0, 0), train(0, {0: [(0, 2)]})), 1)
    assert report.ok, report.verdict()


# ---------------------------------------------------------------- multi-turn episodes (`turns` spans)


def episode_train(step, uid, versions, turns):
    """A train event of one multi-turn group: `turns` is [(sample, [(v, tokens), ...]), ...]."""
    return {"event": "train", "step": step,
            "groups": [{"uid": uid, "versions": [list(r) for r in versions],
                        "turns": [[s, [list(r) for r in span]] for s, span in turns]}]}


# Two samples, five turns, spanning versions 0 and 1: sample 0's second turn straddles the update.
TURNS = [(0, [(0, 5)]), (1, [(0, 7)]), (0, [(0, 2), (1, 3)]), (1, [(1, 4)]), (0, [(1, 6)])]
EPISODE = (admit(0), train(0, {}), episode_train(1, 0, [(0, 14), (1, 13)], TURNS))


def test_a_valid_multi_turn_ledger_passes_and_counts_its_episodes_and_turns(tmp_path):
    with LedgerWriter(tmp_path / "ledger.jsonl") as led:
        led.admit(Admission(0, "p", 0, 1))
        led.train(0, [])
        led.train(1, [(0, [(0, 14), (1, 13)], TURNS)])
    assert json.loads((tmp_path / "ledger.jsonl").read_text().splitlines()[-1]) == EPISODE[-1]
    r = audit(tmp_path, max_staleness=1)
    assert r.ok, r.verdict()
    assert (r.episodes, r.turns, r.tokens_trained) == (2, 5, 27)
    assert "2 episodes (5 turns) checked turn by turn" in r.verdict()


def test_a_group_without_turns_writes_no_turns_key_and_counts_no_episode(tmp_path):
    with LedgerWriter(tmp_path / "ledger.jsonl") as led:
        led.admit(Admission(0, "p", 0, 1))
        led.train(0, [(0, [(0, 3)], None)])
    assert "turns" not in (tmp_path / "ledger.jsonl").read_text()
    r = audit(tmp_path, max_staleness=0)
    assert r.ok and (r.episodes, r.turns) == (0, 0)


@pytest.mark.parametrize("turns, text", [
    ([(0, [(0, 5)]), (1, [(0, 7)]), (0, [(0, 2), (1, 3)]), (1, [(1, 4)]), (0, [(1, 5)])],
     "uid 0 samples 0, 1: their turns do not add up to the group's versions: version 1: turns 12 != group 13"),
    ([(0, [(0, 5)]), (1, [(0, 7)]), (0, [(0, 2), (1, 3)]), (1, [(1, 4)]), (0, [(1, 6)]), (1, [(2, 1)])],
     "version 2: turns 1 != group 0"),
    ([(0, [(0, 5)]), (1, [(1, 4)]), (0, [(0, 2), (1, 3)]), (1, [(0, 7)]), (0, [(1, 6)])],
     "uid 0 sample 1 has a turn on version 0 after a turn on version 1 (a later turn sampled on older weights)"),
    ([(0, [(0, 5)]), (1, [(0, 7)]), (0, [(1, 3)]), (0, [(0, 2)]), (1, [(1, 4)]), (0, [(1, 6)])],
     "uid 0 sample 0 has a turn on version 0 after a turn on version 1"),
])
def test_forged_turn_spans_are_errors_naming_line_uid_and_sample(tmp_path, turns, text):
    write_ledger(tmp_path, admit(0), train(0, {}), episode_train(1, 0, [(0, 14), (1, 13)], turns))
    report = audit(tmp_path, max_staleness=1)
    only_error(report, text)
    assert report.errors[0].startswith("line 3: ")


def test_a_negative_turn_count_is_an_error_even_when_the_sums_agree(tmp_path):
    turns = [(0, [(0, 5)]), (1, [(0, 7)]), (0, [(0, 2), (1, 3)]), (1, [(1, 4)]), (0, [(1, 8)]), (1, [(1, -2)])]
    write_ledger(tmp_path, admit(0), train(0, {}), episode_train(1, 0, [(0, 14), (1, 13)], turns))
    only_error(audit(tmp_path, max_staleness=1), "uid 0 sample 1 has a turn with -2 tokens of version 1 (< 0)")


def test_the_cli_reports_episodes_and_turns_in_its_json(tmp_path, capsys):
    write_ledger(tmp_path, *EPISODE)
    assert main([str(tmp_path), "--max-staleness", "1", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["episodes"], out["turns"], out["ok"]) == (2, 5, True)
