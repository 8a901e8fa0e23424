"""Lookahead's fault path, deterministic: the start barrier and deadline of a regenerated or resumed
group (docs/design.md §2, "Faults"), a group lost before it started, without refinement, without a
bound, and across a checkpoint (the state a resumed run re-admits from)."""

from __future__ import annotations

import pytest

from planner.feasibility import feasible
from planner.policies.lookahead import Lookahead, LookaheadParams
from planner.types import Candidate, GroupState, PlanContext


def planner(eta=2, B=1, refine=True, steps=20) -> Lookahead:
    return Lookahead(PlanContext(batch_groups=B, group_size=1, max_staleness=eta, total_steps=steps),
                     LookaheadParams(refine_on_start=refine))


def synced_at(p: Lookahead, version: int) -> None:
    p.on_version_published(version=version, now=0)
    p.on_version_synced(version=version, now=0)


def admitted(p: Lookahead, uid: int):
    (a,) = p.admit(now=0, candidates=[Candidate(uid, uid)]).admit
    return a


@pytest.mark.parametrize("prefix_kept", [False, True], ids=["regenerated", "resumed"])
def test_a_lost_group_that_started_on_newer_weights_is_readmitted_with_that_start_as_its_barrier(prefix_kept):
    p = planner(eta=2)
    a = admitted(p, 0)
    assert (a.version, a.deadline) == (0, 2)
    p.on_group_started(uid=0, version=1, now=0)  # a worker already on v1 (the synced version is 0)
    assert p.groups[0].deadline == 3 and p.counts == {3: 1}
    p.on_tokens(uid=0, version=1, tokens=4, now=0)
    (re,) = p.on_group_lost(uid=0, prefix_kept=prefix_kept, now=0).admit
    assert (re.uid, re.prompt_id, re.version, re.deadline, re.priority) == (0, 0, 1, 3, 3.0)  # barrier: first start
    g = p.groups[0]
    assert g.status == GroupState.QUEUED and g.admit_version == 1 and g.deadline == 3 and p.counts == {3: 1}
    assert p.inflight == 1 and p.admitted_total == 1  # a re-admission is not a new admission
    if prefix_kept:  # resumed: its tokens stay, and so does its first start
        assert g.versions == {1: 4} and g.start_version == 1
    else:  # regenerated: it starts afresh
        assert g.versions == {} and g.start_version is None


def test_a_regenerated_group_on_a_later_synced_version_moves_its_deadline_later_and_never_earlier():
    p = planner(eta=2, B=2)
    admitted(p, 0)
    p.on_group_started(uid=0, version=0, now=0)
    synced_at(p, 3)  # the other workers moved on meanwhile
    (re,) = p.on_group_lost(uid=0, prefix_kept=False, now=0).admit
    assert (re.version, re.deadline) == (3, 5) and p.counts == {5: 1}
    p.on_group_started(uid=0, version=4, now=0)  # its new first start refines it again
    assert p.groups[0].deadline == 6 and p.groups[0].start_version == 4 and p.counts == {6: 1}
    p.on_group_lost(uid=0, prefix_kept=True, now=0)
    p._set_deadline(p.groups[0], 1)  # never earlier: that could break (F)
    assert p.groups[0].deadline == 6 and p.counts == {6: 1}


def test_a_group_lost_before_it_started_is_readmitted_at_the_synced_version():
    p = planner(eta=1)
    admitted(p, 0)
    (re,) = p.on_group_lost(uid=0, prefix_kept=False, now=0).admit
    assert (re.version, re.deadline) == (0, 1)
    synced_at(p, 1)
    (re,) = p.on_group_lost(uid=0, prefix_kept=True, now=0).admit  # resumed, never started: no barrier to raise
    assert (re.version, re.deadline) == (0, 1) and p.counts == {1: 1}


def test_without_refinement_the_barrier_is_only_the_synced_version():
    p = planner(eta=2, refine=False)
    admitted(p, 0)
    p.on_group_started(uid=0, version=1, now=0)
    assert p.groups[0].deadline == 2  # no refinement on start either
    (re,) = p.on_group_lost(uid=0, prefix_kept=True, now=0).admit
    assert (re.version, re.deadline) == (0, 2)
    synced_at(p, 1)
    (re,) = p.on_group_lost(uid=0, prefix_kept=False, now=0).admit
    assert (re.version, re.deadline) == (1, 3) and p.counts == {3: 1}


def test_an_unbounded_planner_readmits_by_admission_order_with_no_deadline():
    p = planner(eta=None)
    admitted(p, 0)
    admitted(p, 1)
    p.on_group_started(uid=1, version=0, now=0)
    (re,) = p.on_group_lost(uid=1, prefix_kept=False, now=0).admit
    assert (re.deadline, re.priority, re.version) == (None, 1.0, 0) and p.counts == {}


def test_lost_reports_for_a_done_or_unknown_group_change_nothing():
    p = planner(eta=1)
    admitted(p, 0)
    p.on_group_started(uid=0, version=0, now=0)
    p.on_group_finished(uid=0, versions=[(0, 2)], now=0)
    assert not p.on_group_lost(uid=0, prefix_kept=False, now=0) and p.groups[0].status == GroupState.DONE
    assert not p.on_group_lost(uid=42, prefix_kept=False, now=0)


def test_a_checkpoint_taken_with_groups_in_flight_restores_their_barriers_and_the_schedule():
    """What a resumed run re-admits from: the policy's state with a started group and a queued one."""
    p = planner(eta=2, B=1)
    for uid in range(3):
        admitted(p, uid)
    p.on_group_started(uid=0, version=0, now=0)
    p.on_group_finished(uid=0, versions=[(0, 1)], now=0)
    assert p.select_batch(step=0, now=0).train == [0]
    p.on_step_done(step=0, now=0)
    synced_at(p, 1)
    p.on_group_started(uid=1, version=1, now=0)  # deadline 0+2 -> 1+2
    clone = planner(eta=2, B=1)
    clone.load_state_dict(p.state_dict())
    assert clone.counts == p.counts == {2: 1, 3: 1} and clone.plan == p.plan
    assert {u: (g.deadline, g.start_version, g.status) for u, g in clone.groups.items()} == {
        1: (3, 1, GroupState.RUNNING), 2: (2, None, GroupState.QUEUED)}
    # The resumed run regenerates both (their engine is gone): 1 keeps its barrier v1, 2 gets the synced v1.
    readmitted = [clone.on_group_lost(uid=u, prefix_kept=False, now=0).admit[0] for u in (1, 2)]
    assert [(a.uid, a.version, a.deadline) for a in readmitted] == [(1, 1, 3), (2, 1, 3)]
    assert clone.counts == {3: 2} and feasible(clone.counts, clone.next_batch_step, 1)
    assert clone.inflight == 2 and clone.untrained == 2 and clone.admitted_total == 3
