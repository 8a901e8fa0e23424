"""Lookahead's tail rule: while the trainer waits for batch k, the in-flight groups bound to k are
named critical (and, with policy.migrate, migrated), each once per attempt, and the bound holds."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from planner.policies.lookahead import Lookahead, LookaheadParams
from planner.sim import EventRecorder, SimConfig, Simulator, first_divergence, make_workload
from planner.ledger_audit import audit
from planner.types import Candidate, PlanContext
from tests.helpers.adversarial import AdversarialDriver


def started_policy(migrate: bool, tail_fraction: float = 0.0) -> tuple[Lookahead, list[int]]:
    """B=2, η=1: four groups admitted at version 0 (deadline 1), three started, one finished."""
    p = Lookahead(PlanContext(batch_groups=2, group_size=1, max_staleness=1, total_steps=4),
                  LookaheadParams(migrate=migrate, tail_fraction=tail_fraction))
    uids = [a.uid for a in p.admit(now=0, candidates=[Candidate(i, i) for i in range(4)]).admit]
    for uid in uids[:3]:
        p.on_group_started(uid=uid, version=0, now=0)
    p.on_group_finished(uid=uids[0], versions=[(0, 5)], now=1)
    return p, uids


def test_the_groups_the_next_batch_needs_are_marked_once():
    p, uids = started_policy(migrate=False)
    d = p.select_batch(step=0, now=1)
    assert d.train is None
    # η=1: every deadline is 1 > step 0, so batch 0 needs no particular group: nothing marked.
    assert all(p.groups[u].deadline == 1 for u in uids)
    assert d.critical == [] and d.migrate == []
    # Batch 0 trains two finished groups; batch 1, needed next, cannot do without the two left.
    p.on_group_finished(uid=uids[1], versions=[(0, 3)], now=2)
    d = p.select_batch(step=0, now=2)
    assert d.train == [uids[0], uids[1]]
    assert d.critical == [uids[2], uids[3]]  # the running one and the queued one, while step 0 trains
    assert d.migrate == []  # policy.migrate=false
    p.on_step_done(step=0, now=3)
    d = p.select_batch(step=1, now=3)
    assert d.train is None and not d.critical  # once per attempt


def test_a_waiting_trainer_marks_what_its_batch_needs():
    p = Lookahead(PlanContext(batch_groups=2, group_size=1, max_staleness=0, total_steps=2),
                  LookaheadParams(migrate=True, tail_fraction=0.0))
    uids = [a.uid for a in p.admit(now=0, candidates=[Candidate(i, i) for i in range(4)]).admit]
    assert len(uids) == 2  # η=0: batch 0's two groups, deadline 0
    p.on_group_started(uid=uids[0], version=0, now=0)
    d = p.select_batch(step=0, now=0)
    assert d.train is None and d.critical == uids and d.migrate == [uids[0]]  # the queued one cannot move
    assert p.on_group_started(uid=uids[1], version=0, now=1).migrate == [uids[1]]


def test_with_migrate_the_running_groups_bound_to_the_step_move_once_per_attempt():
    p, uids = started_policy(migrate=True)
    p.on_group_finished(uid=uids[1], versions=[(0, 3)], now=2)
    d = p.select_batch(step=0, now=2)
    assert d.critical == [uids[2], uids[3]] and d.migrate == [uids[2]]  # only a running group moves
    p.on_step_done(step=0, now=3)
    assert not p.select_batch(step=1, now=3).critical
    # The queued one starts (on version 0) while the trainer waits for batch 1: moved at its start.
    d = p.on_group_started(uid=uids[3], version=0, now=4)
    assert d.critical == [] and d.migrate == [uids[3]]
    assert not p.select_batch(step=1, now=4).migrate  # never twice: no ping-pong
    # A lost group is a new attempt: marked again once it runs again.
    readmit = p.on_group_lost(uid=uids[2], prefix_kept=True, now=5).admit
    assert [a.uid for a in readmit] == [uids[2]]
    d = p.on_group_started(uid=uids[2], version=0, now=6)
    assert d.critical == [uids[2]] and d.migrate == [uids[2]]


def test_a_group_that_starts_on_newer_weights_is_not_bound_to_the_waiting_step():
    p, uids = started_policy(migrate=True)
    p.on_group_finished(uid=uids[1], versions=[(0, 3)], now=2)
    p.select_batch(step=0, now=2)
    p.on_step_done(step=0, now=3)
    p.select_batch(step=1, now=3)
    p.on_group_lost(uid=uids[3], prefix_kept=False, now=4)  # regenerated: a new attempt
    d = p.on_group_started(uid=uids[3], version=1, now=4)  # refined deadline 2 > 1
    assert p.groups[uids[3]].deadline == 2 and not d.critical and not d.migrate


def test_the_tail_state_survives_a_checkpoint():
    p, uids = started_policy(migrate=True)
    p.on_group_finished(uid=uids[1], versions=[(0, 3)], now=2)
    p.select_batch(step=0, now=2)
    p.on_step_done(step=0, now=3)
    p.select_batch(step=1, now=3)
    q = Lookahead(p.ctx, LookaheadParams(migrate=True, tail_fraction=0.0))
    q.load_state_dict(p.state_dict())
    assert not q.select_batch(step=1, now=3).critical  # already marked before the checkpoint
    assert q.on_group_started(uid=uids[3], version=0, now=4).migrate == [uids[3]]


def test_the_stragglers_of_a_deadline_class_are_marked_once_most_of_it_is_done():
    p = Lookahead(PlanContext(batch_groups=2, group_size=1, max_staleness=2, total_steps=4),
                  LookaheadParams(migrate=True, tail_fraction=0.5))
    uids = [a.uid for a in p.admit(now=0, candidates=[Candidate(i, i) for i in range(8)]).admit]
    assert len(uids) == 6 and all(p.groups[u].deadline == 2 for u in uids)  # one class, needed at step 2
    for uid in uids:
        p.on_group_started(uid=uid, version=0, now=0)
    for uid in uids[:2]:
        assert not p.on_group_finished(uid=uid, versions=[(0, 1)], now=1)  # 4 of 6 left: not yet
    d = p.on_group_finished(uid=uids[2], versions=[(0, 1)], now=2)  # 3 <= 0.5·6: the last three
    assert d.critical == uids[3:] and d.migrate == uids[3:]
    assert not p.on_group_finished(uid=uids[3], versions=[(0, 1)], now=3)  # already marked
    assert not Lookahead(p.ctx, LookaheadParams(tail_fraction=0.0)).on_group_finished(uid=0, versions=[], now=0)


def test_tail_fraction_is_a_share():
    with pytest.raises(ValueError, match=r"policy.tail_fraction"):
        LookaheadParams(tail_fraction=1.5)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**31), eta=st.integers(0, 3), batch=st.integers(1, 4), steps=st.integers(1, 8),
       faults=st.booleans())
def test_tail_decisions_keep_the_bound_exact_without_drops(seed, eta, batch, steps, faults):
    ctx = PlanContext(batch_groups=batch, group_size=2, max_staleness=eta, total_steps=steps)
    with tempfile.TemporaryDirectory() as tmp:
        policy = Lookahead(ctx, LookaheadParams(migrate=True))
        out = AdversarialDriver(policy, Path(tmp), seed, faults=faults).run()
        report = audit(tmp, eta)
    assert not out.deadlock and out.steps == steps
    assert report.ok, report.verdict()
    assert report.groups_dropped == 0 and report.max_token_staleness <= eta


def test_a_simulated_run_with_critical_marks_replays_from_its_recording(tmp_path):
    ctx = PlanContext(4, 4, 1, 10)
    recorder = EventRecorder()
    Simulator(Lookahead(ctx, LookaheadParams(migrate=True)), ctx, make_workload({"name": "heavy_tail"}, 4),
              SimConfig(), seed=1, recorder=recorder).run()
    assert any(c.decision.critical for c in recorder.calls), "the run must exercise the tail rule"
    assert any(c.decision.migrate for c in recorder.calls)
    recorder.dump(tmp_path / "events.jsonl")
    loaded = EventRecorder.load(tmp_path / "events.jsonl")
    assert first_divergence(loaded, Lookahead(ctx, LookaheadParams(migrate=True))) is None
