"""planner.driver: how every driver applies a Decision, keeps token versions and writes its run files."""

import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from planner import driver
from planner.driver import DecisionHost, Held, apply_decision
from planner.sim.simulator import Simulator
from planner.types import Admission, Decision, Drop, Move
from tests.helpers.adversarial import AdversarialDriver
from tests.helpers.scripted import ScriptedDriver


class Host:
    """A hand-made host: uids in named states, and a log of the hooks called."""

    def __init__(self, **states: Held) -> None:
        self.states = {int(uid[1:]): held for uid, held in states.items()}  # u3=Held.DONE -> uid 3
        self.log: list[tuple] = []

    def held(self, uid: int) -> Held:
        return self.states.get(uid, Held.NOTHING)

    def record_moves(self, moves: list[Move]) -> None:
        self.log.append(("moves", [m.uid for m in moves]))

    def drop_group(self, drop: Drop) -> None:
        self.log.append(("drop", drop.uid))
        del self.states[drop.uid]

    def train_batch(self, uids: list[int]) -> None:
        self.log.append(("train", list(uids)))
        for uid in uids:
            del self.states[uid]

    def admit_group(self, a: Admission) -> None:
        self.log.append(("admit", a.uid))
        self.states[a.uid] = Held.GENERATING


def admission(uid: int) -> Admission:
    return Admission(uid, prompt_id=uid, version=0)


def test_a_decision_is_applied_in_the_documented_order_moves_drops_batch_then_admissions_in_list_order():
    host = Host(u1=Held.GENERATING, u2=Held.LOST, u3=Held.DONE, u4=Held.DONE, u5=Held.CANDIDATE, u6=Held.CANDIDATE)
    d = Decision(admit=[admission(6), admission(5)], drop=[Drop(2, 0, "stale"), Drop(1, 0, "stale")],
                 moves=[Move(5, -1, 1)], train=[3, 4])
    apply_decision(host, d, call="select_batch", policy="p")
    assert host.log == [("moves", [5]), ("drop", 2), ("drop", 1), ("train", [3, 4]), ("admit", 6), ("admit", 5)]


def test_a_dropped_group_cannot_be_readmitted_by_the_same_decision_because_drops_come_first():
    """Applied the other way round, the lost group would be re-admitted and then dropped: an
    admission the ledger shows for a group that the same decision closed."""
    host = Host(u2=Held.LOST)
    with pytest.raises(ValueError, match="admitted uid 2 in on_group_lost: it is unknown"):
        apply_decision(host, Decision(admit=[admission(2)], drop=[Drop(2, 0, "stale")]), call="on_group_lost",
                       policy="p")
    assert host.log == [("drop", 2)]


def test_drops_come_before_admissions_even_when_they_name_other_groups():
    host = Host(u1=Held.DONE, u2=Held.LOST)
    apply_decision(host, Decision(admit=[admission(2)], drop=[Drop(1, 0, "stale")]), call="admit", policy="p")
    assert host.log == [("drop", 1), ("admit", 2)] and host.states == {2: Held.GENERATING}


@pytest.mark.parametrize("call", ["admit", "on_group_finished", "on_step_done", "finish"])
def test_only_select_batch_may_return_a_batch(call):
    host = Host(u3=Held.DONE)
    with pytest.raises(ValueError, match=f"policy p: {call} returned a batch; only select_batch may"):
        apply_decision(host, Decision(train=[3]), call=call, policy="p")
    assert host.log == []


@pytest.mark.parametrize("held", [Held.NOTHING, Held.CANDIDATE])
def test_a_drop_must_name_an_admitted_untrained_group(held):
    host = Host(u7=held)
    with pytest.raises(ValueError, match=f"dropped uid 7 in admit: it is {held.value}, not an admitted, untrained"):
        apply_decision(host, Decision(drop=[Drop(7, 0, "stale")]), call="admit", policy="p")


@pytest.mark.parametrize("held", [Held.NOTHING, Held.GENERATING, Held.DONE])
def test_an_admission_must_name_a_candidate_or_a_lost_group(held):
    host = Host(u7=held)
    with pytest.raises(ValueError, match=f"admitted uid 7 in admit: it is {held.value}, neither a candidate nor a"):
        apply_decision(host, Decision(admit=[admission(7)]), call="admit", policy="p")


def test_a_uid_admitted_twice_in_one_decision_is_an_error_after_the_first_admission():
    host = Host(u7=Held.CANDIDATE)
    with pytest.raises(ValueError, match="admitted uid 7 in admit: it is generating"):
        apply_decision(host, Decision(admit=[admission(7), admission(7)]), call="admit", policy="p")
    assert host.log == [("admit", 7)]


@pytest.mark.parametrize(("batch", "message"), [([3, 3], r"batch \[3, 3\] names a uid twice"),
                                                ([3, 4], "trained uid 4: it is generating, not done"),
                                                ([3, 9], "trained uid 9: it is unknown, not done")])
def test_a_batch_must_name_distinct_done_groups(batch, message):
    host = Host(u3=Held.DONE, u4=Held.GENERATING)
    with pytest.raises(ValueError, match=message):
        apply_decision(host, Decision(train=batch), call="select_batch", policy="p")
    assert host.log == []


@pytest.mark.parametrize("cls", [Simulator, AdversarialDriver, ScriptedDriver])
def test_every_planner_driver_is_a_decision_host(cls):
    assert issubclass(cls, DecisionHost)


# ---------------------------------------------------------------------------- version runs
def test_append_merges_a_run_on_the_same_version_and_starts_one_on_another():
    runs: driver.VersionRuns = []
    for version, tokens in [(0, 2), (0, 3), (1, 1), (0, 1), (0, 4)]:
        driver.append_run(runs, version, tokens)
    assert runs == [[0, 5], [1, 1], [0, 5]]


def test_joined_pieces_merge_at_the_seam_and_never_alias_the_pieces():
    pieces = [[[0, 2]], [[0, 1], [1, 3]], [], [[1, 2], [2, 1]]]
    runs = driver.join_runs(pieces)
    assert runs == [[0, 3], [1, 5], [2, 1]]
    runs[0][1] = 99
    assert pieces[0] == [[0, 2]]


@given(st.lists(st.integers(0, 4), max_size=60))
def test_encoding_per_token_versions_round_trips_with_no_adjacent_equal_runs(versions):
    runs = driver.encode_runs(versions)
    assert driver.decode_runs(runs) == versions
    assert all(a[0] != b[0] for a, b in zip(runs, runs[1:])) and all(t > 0 for _, t in runs)
    assert driver.join_runs([driver.encode_runs(versions[:7]), driver.encode_runs(versions[7:])]) == runs


def test_tokens_by_version_sum_over_samples_oldest_first_and_staleness_counts_tokens():
    versions = driver.tokens_by_version([[[2, 3], [3, 1]], [[1, 2]], [[3, 4]]])
    assert versions == [(1, 2), (2, 3), (3, 5)]
    hist: dict[int, int] = {}
    driver.add_staleness(hist, 3, versions)
    assert hist == {2: 2, 1: 3, 0: 5}
    assert driver.staleness_max(hist) == 2 and driver.staleness_mean(hist) == pytest.approx((4 + 3) / 10)
    assert driver.hist_json(hist) == {"0": 5, "1": 3, "2": 2}
    assert driver.staleness_max({}) == 0 and driver.staleness_mean({}) == 0.0


# ---------------------------------------------------------------------------- run files
def test_a_summary_has_the_design_keys_first_then_the_drivers_extensions():
    s = driver.summary(policy="p", max_staleness=1, staleness_bound=1, steps=4, groups_admitted=9, groups_trained=8, groups_dropped=1,
                       tokens_wasted=5, staleness={0: 10, 1: 30}, elapsed_s=2.0, trainer_busy_s=1.0,
                       generator_busy_s=3.0, record_s=[0.2, 0.5, 1.0, 1.5], extensions={"seed": 0})
    assert list(s) == [*driver.SUMMARY_KEYS, "seed"]
    assert s["steps_per_hour_steady"] == pytest.approx(3600 / 0.5)  # step 3 over 1.0 -> 1.5 s
    assert s["tokens_trained"] == 40 and s["max_token_staleness"] == 1 and s["mean_token_staleness"] == 0.75
    assert s["generator_busy_fraction"] == 1.0 and s["trainer_busy_fraction"] == 0.5 and s["steps_per_hour"] == 7200


def test_the_steady_state_steps_per_hour_leaves_the_warm_up_steps_out():
    # Steps 0-2 take 10 s (a compile), steps 3-5 take 1 s each: 3600 steps/h steady, not whole-run.
    record_s = [10.0, 11.0, 12.0, 13.0, 14.0, 15.0]
    assert driver.steady_steps_per_hour(record_s) == pytest.approx(3600.0)
    assert driver.steady_steps_per_hour(record_s, warmup=1) == pytest.approx(3600.0)
    assert driver.steady_steps_per_hour(record_s, warmup=0) == pytest.approx(6 / 15 * 3600)
    assert driver.steady_steps_per_hour(record_s[:3]) is None  # no step after the warm-up


def test_a_step_record_has_the_common_keys_first_and_tokens_per_s_over_the_whole_cycle():
    r = driver.step_record(step=2, reward_mean=None, loss=None, batch={1: 30, 0: 10}, cycle_s=4.0, wait_s=1.0,
                           start_s=7.0, end_s=8.0, elapsed_s=8.0, trainer_busy_s=4.0, generator_busy_s=6.0,
                           gen_active=(3, -1), kv_usage=0.5, staleness={0: 50, 1: 30}, extensions={"tokens": 40})
    assert list(r) == [*driver.STEP_KEYS, "tokens"]
    assert r["tokens_per_s"] == 10.0 and r["tokens_trained"] == 40 and r["version"] == 3
    assert r["max_staleness_in_batch"] == 1 and r["mean_staleness_in_batch"] == 0.75
    assert r["trainer_busy"] == 0.5 and r["gen_active"] == [3, -1] and r["staleness_hist"] == {"0": 50, "1": 30}


def test_the_driver_module_imports_neither_jax_nor_asyncio_nor_the_runtime():
    """The engines import it for the version runs; the planner stays pure."""
    code = ("import sys, planner.driver; "
            "print(sorted(m for m in ('jax', 'asyncio', 'jaxrl_async', 'numpy') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
