"""planner.types: the records and the one group vocabulary."""

from planner.base import Group
from planner.types import GroupState


def test_a_saved_policy_table_keeps_its_state_numbers_so_checkpoints_written_before_still_load():
    """A policy's `state_dict` writes `int(status)`; QUEUED..DROPPED were 0..4 before LOST and
    CANDIDATE joined the vocabulary, so the new members come after them."""
    saved = [GroupState.QUEUED, GroupState.RUNNING, GroupState.DONE, GroupState.TRAINED, GroupState.DROPPED]
    assert [int(s) for s in saved] == [0, 1, 2, 3, 4]
    g = Group(uid=1, prompt_id=1, seq=0, admit_version=0, admit_step=0, status=GroupState.DROPPED)
    assert g.to_json()["status"] == 4 and Group.from_json(g.to_json()).status is GroupState.DROPPED


def test_only_queued_and_running_compare_as_in_flight():
    """The simulator counts in-flight groups as `state <= RUNNING`."""
    assert {s for s in GroupState if s <= GroupState.RUNNING} == {GroupState.QUEUED, GroupState.RUNNING}
