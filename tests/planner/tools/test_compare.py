"""`python -m planner.compare`'s own keys and what its plots draw: drops shown, the Gantt window
chosen, the no-drop bound never above the ceiling."""

import pytest

import planner.policies  # noqa: F401  (registers the baselines)
import planner.policies.lookahead  # noqa: F401
from planner.ledger import read_ledger
from planner.tools.compare import CAPPED, CAPPED_NOTE, GANTT_START, GANTT_STEPS, markdown, parse_args
from planner.tools.plots import eta_series, schedule_gantt, throughput_vs_eta
from planner.tools.simulate import SimulateConfig, run_simulation


def test_the_gantt_window_is_compares_own_key_with_a_default():
    own, passthrough = parse_args(["policies=[lookahead]", "gantt.start=3", "gantt.steps=4", "steps=20"])
    assert (own["gantt.start"], own["gantt.steps"], passthrough) == (3, 4, ["steps=20"])
    own, _ = parse_args(["policies=[lookahead]"])
    assert (own["gantt.start"], own["gantt.steps"]) == (GANTT_START, GANTT_STEPS) and GANTT_STEPS > 2


@pytest.mark.parametrize("arg, message", [("gantt.steps=0", "gantt.steps=0: must be an integer >= 1"),
                                          ("gantt.start=-1", "gantt.start=-1: must be an integer >= 0"),
                                          ("gantt.start=x", "gantt.start='x': must be an integer >= 0")])
def test_a_bad_gantt_window_is_a_one_line_error_naming_the_key(arg, message):
    with pytest.raises(ValueError, match=message):
        parse_args(["policies=[lookahead]", arg])


def rows(drops=0, bound=150.0):
    return [{"policy": "p", "eta": eta, "steps_per_hour": 80.0 + eta, "unbounded_ceiling": 100.0,
             "no_drop_bound": bound * eta, "groups_dropped": drops if eta == 2 else 0} for eta in (1, 2, 4)]


def test_the_no_drop_bound_is_drawn_capped_at_the_ceiling_and_drops_are_carried():
    series = eta_series(rows(drops=7))
    assert series["bound"] == [(1, 100.0), (2, 100.0), (4, 100.0)]  # 150, 300, 600 in results.csv
    assert series["policies"]["p"] == [(1, 81.0, 0), (2, 82.0, 7), (4, 84.0, 0)]
    assert eta_series(rows(bound=30.0))["bound"] == [(1, 30.0), (2, 60.0), (4, 100.0)]


def table_rows(bounds):
    return [{"workload": "w", "policy": "p", "eta": eta, "steps_per_hour": 80.0, "unbounded_ceiling": 100.0,
             "no_drop_bound": bound, "max_token_staleness": eta, "groups_dropped": 0, "tokens_wasted": 0,
             "trainer_busy_fraction": 0.5, "generator_busy_fraction": 0.5} for eta, bound in enumerate(bounds, 1)]


def bound_column(table):
    head, _, *body = table.splitlines()
    column = [c.strip() for c in head.strip("|").split("|")].index("no-drop bound")
    return [[c.strip() for c in line.strip("|").split("|")][column] for line in body if line.startswith("|")]


def test_the_table_never_prints_the_no_drop_bound_above_the_ceiling_and_says_why_it_is_capped():
    table = markdown(table_rows([90.0, 100.9, 600.0]))
    assert bound_column(table) == ["90.0", f"100.0{CAPPED}", f"100.0{CAPPED}"]  # 100.9 and 600 in results.csv
    assert table.rstrip().endswith(CAPPED_NOTE) and "above the measured ceiling" in CAPPED_NOTE
    uncapped = markdown(table_rows([90.0, 100.0]))
    assert bound_column(uncapped) == ["90.0", "100.0"] and CAPPED_NOTE not in uncapped


def test_throughput_vs_eta_draws_rows_with_drops(tmp_path):
    throughput_vs_eta(rows(drops=7), tmp_path / "t.png", title="w")
    assert (tmp_path / "t.png").stat().st_size > 0


def simulated_ledger(tmp_path, policy, **over):
    cfg = {"policy": {"name": policy}, "max_staleness": 1, "batch_groups": 4, "group_size": 2, "steps": 12,
           "seed": 0, "workload": {"name": "heavy_tail"}, "sim": {}, "calibration": None} | over
    run_simulation(SimulateConfig.from_mapping(cfg), tmp_path / policy, plots=False)
    return tmp_path / policy / "ledger.jsonl"


def test_the_gantt_draws_the_groups_admitted_in_its_window(tmp_path):
    ledger = simulated_ledger(tmp_path, "lookahead")
    first = {}
    for e in read_ledger(ledger):
        if e["event"] == "admit":
            first.setdefault(e["uid"], e["version"])
    drawn = schedule_gantt(ledger, tmp_path / "g.png", start=3, steps=4)
    assert set(drawn) == {uid for uid, v in first.items() if 3 <= v < 7} and len(drawn) > 4 * 2
    assert all(r["trained"] is not None for r in drawn.values())
    default = schedule_gantt(ledger, tmp_path / "d.png", start=GANTT_START, steps=GANTT_STEPS)
    assert set(default) == {uid for uid, v in first.items() if v < GANTT_STEPS}


def test_the_gantt_marks_the_groups_a_policy_dropped(tmp_path):
    ledger = simulated_ledger(tmp_path, "nemo_in_order", steps=6)
    dropped = {e["uid"]: e["step"] for e in read_ledger(ledger) if e["event"] == "drop"}
    assert dropped  # non-trivial: this run drops groups
    drawn = schedule_gantt(ledger, tmp_path / "g.png", start=0, steps=10)
    assert {uid: r["dropped"] for uid, r in drawn.items() if r["dropped"] is not None} == {
        uid: step for uid, step in dropped.items() if uid in drawn}
    assert any(r["dropped"] is not None for r in drawn.values())
