"""planner.driver: how every driver applies a Decision."""

import pytest

from planner.driver import DecisionHost, apply_decision
from planner.sim.simulator import Simulator
from planner.types import Admission, Decision, Drop, GroupState, Move
from tests.helpers.adversarial import AdversarialDriver
from tests.helpers.scripted import ScriptedDriver


class Host:
    """A hand-made host: uids in named states, and a log of the hooks called."""

    def __init__(self, **states: GroupState | None) -> None:
        self.states = {int(uid[1:]): held for uid, held in states.items()}  # u3=GroupState.DONE -> uid 3
        self.log: list[tuple] = []

    def held(self, uid: int) -> GroupState | None:
        return self.states.get(uid)

    def record_moves(self, moves: list[Move]) -> None:
        self.log.append(("moves", [m.uid for m in moves]))

    def mark_critical(self, uids: list[int]) -> None:
        self.log.append(("critical", list(uids)))

    def migrate_groups(self, uids: list[int]) -> None:
        self.log.append(("migrate", list(uids)))

    def drop_group(self, drop: Drop) -> None:
        self.log.append(("drop", drop.uid))
        del self.states[drop.uid]

    def train_batch(self, uids: list[int]) -> None:
        self.log.append(("train", list(uids)))
        for uid in uids:
            del self.states[uid]

    def admit_group(self, a: Admission) -> None:
        self.log.append(("admit", a.uid))
        self.states[a.uid] = GroupState.QUEUED


def admission(uid: int) -> Admission:
    return Admission(uid, prompt_id=uid, version=0)


def test_a_decision_is_applied_in_the_documented_order_moves_drops_tail_batch_then_admissions_in_list_order():
    host = Host(u1=GroupState.RUNNING, u2=GroupState.LOST, u3=GroupState.DONE, u4=GroupState.DONE, u5=GroupState.CANDIDATE,
                u6=GroupState.CANDIDATE, u8=GroupState.RUNNING, u9=GroupState.QUEUED)
    d = Decision(admit=[admission(6), admission(5)], drop=[Drop(2, 0, "stale"), Drop(1, 0, "stale")],
                 moves=[Move(5, -1, 1)], train=[3, 4], critical=[8, 9], migrate=[8])
    apply_decision(host, d, call="select_batch", policy="p")
    assert host.log == [("moves", [5]), ("drop", 2), ("drop", 1), ("critical", [8, 9]), ("migrate", [8]),
                        ("train", [3, 4]), ("admit", 6), ("admit", 5)]


@pytest.mark.parametrize("field", ["critical", "migrate"])
@pytest.mark.parametrize(("held", "word"), [(None, "unknown"), (GroupState.CANDIDATE, "a candidate"),
                                           (GroupState.TRAINED, "trained"), (GroupState.LOST, "lost")])
def test_a_critical_mark_or_a_migration_must_name_a_running_group(field, held, word):
    host = Host(u7=held, u8=GroupState.RUNNING)
    with pytest.raises(ValueError, match=f"named uid 7 in {field} in on_tokens: it is {word}, not a running group"):
        apply_decision(host, Decision(**{field: [8, 7]}), call="on_tokens", policy="p")
    assert host.log == []  # checked whole before the hook runs


def test_a_dropped_group_cannot_be_readmitted_by_the_same_decision_because_drops_come_first():
    """Applied the other way round, the lost group would be re-admitted and then dropped: an
    admission the ledger shows for a group that the same decision closed."""
    host = Host(u2=GroupState.LOST)
    with pytest.raises(ValueError, match="admitted uid 2 in on_group_lost: it is unknown"):
        apply_decision(host, Decision(admit=[admission(2)], drop=[Drop(2, 0, "stale")]), call="on_group_lost",
                       policy="p")
    assert host.log == [("drop", 2)]


def test_drops_come_before_admissions_even_when_they_name_other_groups():
    host = Host(u1=GroupState.DONE, u2=GroupState.LOST)
    apply_decision(host, Decision(admit=[admission(2)], drop=[Drop(1, 0, "stale")]), call="admit", policy="p")
    assert host.log == [("drop", 1), ("admit", 2)] and host.states == {2: GroupState.QUEUED}


@pytest.mark.parametrize("call", ["admit", "on_group_finished", "on_step_done", "finish"])
def test_only_select_batch_may_return_a_batch(call):
    host = Host(u3=GroupState.DONE)
    with pytest.raises(ValueError, match=f"policy p: {call} returned a batch; only select_batch may"):
        apply_decision(host, Decision(train=[3]), call=call, policy="p")
    assert host.log == []


@pytest.mark.parametrize(("held", "word"), [(None, "unknown"), (GroupState.CANDIDATE, "a candidate"),
                                           (GroupState.TRAINED, "trained"), (GroupState.DROPPED, "dropped")])
def test_a_drop_must_name_an_admitted_untrained_group(held, word):
    host = Host(u7=held)
    with pytest.raises(ValueError, match=f"dropped uid 7 in admit: it is {word}, not an admitted, untrained"):
        apply_decision(host, Decision(drop=[Drop(7, 0, "stale")]), call="admit", policy="p")


@pytest.mark.parametrize(("held", "word"), [(None, "unknown"), (GroupState.QUEUED, "queued"),
                                           (GroupState.RUNNING, "generating"), (GroupState.DONE, "done")])
def test_an_admission_must_name_a_candidate_or_a_lost_group(held, word):
    host = Host(u7=held)
    with pytest.raises(ValueError, match=f"admitted uid 7 in admit: it is {word}, neither a candidate nor a"):
        apply_decision(host, Decision(admit=[admission(7)]), call="admit", policy="p")


def test_a_uid_admitted_twice_in_one_decision_is_an_error_after_the_first_admission():
    host = Host(u7=GroupState.CANDIDATE)
    with pytest.raises(ValueError, match="admitted uid 7 in admit: it is queued"):
        apply_decision(host, Decision(admit=[admission(7), admission(7)]), call="admit", policy="p")
    assert host.log == [("admit", 7)]


@pytest.mark.parametrize(("batch", "message"), [([3, 3], r"batch \[3, 3\] names a uid twice"),
                                                ([3, 4], "trained uid 4: it is generating, not done"),
                                                ([3, 9], "trained uid 9: it is unknown, not done")])
def test_a_batch_must_name_distinct_done_groups(batch, message):
    host = Host(u3=GroupState.DONE, u4=GroupState.RUNNING)
    with pytest.raises(ValueError, match=message):
        apply_decision(host, Decision(train=batch), call="select_batch", policy="p")
    assert host.log == []


@pytest.mark.parametrize("cls", [Simulator, AdversarialDriver, ScriptedDriver])
def test_every_planner_driver_is_a_decision_host(cls):
    assert issubclass(cls, DecisionHost)


@pytest.mark.parametrize("field", ["critical", "migrate"])
def test_a_critical_mark_or_a_migration_of_a_group_done_meanwhile_is_skipped(field):
    # The policy heard of one finish of several that ended together; the others are done here.
    host = Host(u7=GroupState.DONE, u8=GroupState.RUNNING, u9=GroupState.DONE)
    apply_decision(host, Decision(**{field: [7, 8]}), call="on_group_finished", policy="p")
    apply_decision(host, Decision(**{field: [9]}), call="on_group_finished", policy="p")
    assert host.log == [(field, [8])]  # the done ones dropped; a list left empty calls no hook
