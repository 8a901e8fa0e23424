"""The controller's group table (runtime/groups.py): candidates and live groups in the planner's
`GroupState`, being scored as RUNNING's last part, and the checkpoint's phase strings."""

import pytest

from jaxrl_async.runtime.groups import DONE, GENERATING, SCORING, GroupTable, LiveGroup
from jaxrl_async.runtime.metrics import RunStats
from jaxrl_async.runtime.rollouts import GroupRollout, RolloutSample
from jaxrl_async.runtime.state import ControllerSnapshot, SavedGroup
from jaxrl_async.tasks.base import Prompt
from planner.types import GroupState


def prompt(i: int) -> Prompt:
    return Prompt(f"p{i}", f"say {i}", [i, i + 1, i + 2][: 1 + i % 3], str(i), {})


def rollout(uid: int, attempt: int = 0) -> GroupRollout:
    return GroupRollout(uid, f"p{uid}", [uid], [RolloutSample([uid], [-0.5], [[0, 1]], "stop")], attempt, True)


def table_with(states: dict[int, tuple[GroupState, bool]]) -> GroupTable:
    table = GroupTable(2)
    for uid, (state, scoring) in states.items():
        table.groups[uid] = LiveGroup(prompt(uid), rollout(uid), state, scoring)
    return table


def test_refill_draws_the_stream_in_order_up_to_the_window_size_with_fresh_uids():
    table = GroupTable(3)
    stream = iter([prompt(i) for i in range(10)])
    table.refill(stream)
    assert [(c.uid, c.prompt_id, c.prompt_tokens) for c in table.candidates()] == [(0, "p0", 1), (1, "p1", 2), (2, "p2", 3)]
    assert table.take_candidate(1) == prompt(1)
    table.refill(stream)  # one slot free: one prompt drawn, under the next uid
    assert [c.uid for c in table.candidates()] == [0, 2, 3] and table.next_uid == 4


def test_state_names_what_the_table_holds_of_a_uid_in_the_planners_words():
    table = table_with({0: (GroupState.RUNNING, False), 1: (GroupState.RUNNING, True), 2: (GroupState.DONE, False)})
    table.next_uid = 7
    table.refill(iter([prompt(7), prompt(8)]))
    table.lose(0)
    assert [table.state(uid) for uid in (0, 1, 2, 7, 99)] == [
        GroupState.LOST, GroupState.RUNNING, GroupState.DONE, GroupState.CANDIDATE, None]  # scoring is RUNNING
    assert table.is_lost(0) and not table.is_lost(1) and not table.is_lost(99)


def test_only_a_group_whose_request_is_at_the_engine_is_generating():
    table = table_with({0: (GroupState.RUNNING, False), 1: (GroupState.RUNNING, True), 2: (GroupState.DONE, False),
                        3: (GroupState.RUNNING, False)})
    table.lose(3)
    assert list(table.generating()) == [0]  # not scoring, not done, not lost
    assert table.in_flight() == 3 and table.done() == 1  # a lost or scoring group is still in flight


@pytest.mark.parametrize("state, scoring, phase", [(GroupState.RUNNING, False, GENERATING),
                                                    (GroupState.LOST, False, GENERATING),
                                                    (GroupState.RUNNING, True, SCORING),
                                                    (GroupState.DONE, False, DONE)])
def test_the_checkpoint_keeps_the_phase_strings_old_checkpoints_hold(state, scoring, phase):
    live = LiveGroup(prompt(0), rollout(0), state, scoring)
    assert live.phase_name == phase


def snapshot(groups: tuple[SavedGroup, ...]) -> ControllerSnapshot:
    return ControllerSnapshot(run={}, step=2, version=2, next_uid=9, policy={}, stream={}, window=((8, prompt(8)),),
                              groups=groups, stats=RunStats(), ledger_bytes=0, metrics_bytes=0)


def test_restore_brings_back_done_groups_and_lists_the_others_for_the_fault_path():
    saved = (SavedGroup(prompt(4), DONE, rollout(4)), SavedGroup(prompt(5), SCORING, rollout(5)),
             SavedGroup(prompt(6), GENERATING, rollout(6, attempt=1)))
    table = table_with({0: (GroupState.RUNNING, False)})
    table.lost_on_resume = [0]
    table.restore(snapshot(saved))
    assert {uid: (g.state, g.scoring) for uid, g in table.groups.items()} == {
        4: (GroupState.DONE, False), 5: (GroupState.RUNNING, False), 6: (GroupState.RUNNING, False)}
    assert table.lost_on_resume == [5, 6] and table.next_uid == 9 and [c.uid for c in table.candidates()] == [8]
    table.groups[6].rollout.samples[0].token_ids.append(1)  # the table shares nothing with the snapshot
    assert saved[2].rollout.samples[0].token_ids == [6]


def test_saved_groups_copy_the_rollouts_and_write_the_phase_strings():
    table = table_with({0: (GroupState.DONE, False), 1: (GroupState.RUNNING, True)})
    saved = table.saved_groups()
    table.groups[0].rollout.samples[0].token_ids.append(5)
    assert [(g.rollout.uid, g.phase) for g in saved] == [(0, DONE), (1, SCORING)]
    assert saved[0].rollout.samples[0].token_ids == [0]
