"""The lookahead planner keeps η strictly, drops nothing, never deadlocks, and waits only when forced."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from planner.policies.lookahead import Lookahead, LookaheadParams
from planner.ledger_audit import audit
from planner.types import Candidate, GroupState, PlanContext
from tests.helpers.adversarial import AdversarialDriver


def edf_fits(deadlines: list[int], first_step: int, batch: int) -> bool:
    """Brute force, independent of planner.feasibility: fill steps B at a time in deadline order."""
    return all(first_step + i // batch <= d for i, d in enumerate(sorted(deadlines)))


def wait_is_forced(p: Lookahead) -> str | None:
    done = sorted((g for g in p.groups.values() if g.status == GroupState.DONE), key=lambda g: (g.deadline, g.finish_seq, g.uid))
    if len(done) < p.B:
        return None
    chosen = {g.uid for g in done[: p.B]}
    rest = [g.deadline for g in p.groups.values() if g.uid not in chosen]
    if edf_fits(rest, p.step + 1, p.B):
        return f"step {p.step}: waited although the EDF batch {sorted(chosen)} keeps (F)"
    return None


def run(ctx: PlanContext, seed: int, params: LookaheadParams | None = None, **kw):
    with tempfile.TemporaryDirectory() as tmp:
        policy = Lookahead(ctx, params)
        out = AdversarialDriver(policy, Path(tmp), seed, check_forced=wait_is_forced, **kw).run()
        return policy, out, audit(tmp, ctx.max_staleness)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 2**31),
    eta=st.integers(0, 4),
    batch=st.integers(1, 5),
    steps=st.integers(1, 12),
    faults=st.booleans(),
    partial=st.booleans(),
    predictor=st.sampled_from(["none", "history", "oracle"]),
)
def test_lookahead_is_strict_without_drops_under_adversarial_orders(seed, eta, batch, steps, faults, partial, predictor):
    ctx = PlanContext(batch_groups=batch, group_size=2, max_staleness=eta, total_steps=steps)
    policy, out, report = run(ctx, seed, LookaheadParams(predictor=predictor), faults=faults, partial=partial)
    assert not out.deadlock, "every admitted group must be trainable once generation ends"
    assert out.steps == steps
    assert report.ok, report.verdict()
    assert report.max_token_staleness <= eta
    assert report.groups_dropped == 0 and not report.lost
    assert report.groups_trained == batch * steps
    assert not out.forced_violations, out.forced_violations[0]


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 2**31), batch=st.integers(1, 4))
def test_unbounded_lookahead_trains_everything_it_admits(seed, batch):
    ctx = PlanContext(batch_groups=batch, group_size=1, max_staleness=None, total_steps=6)
    _, out, report = run(ctx, seed)
    assert report.ok and report.groups_trained == batch * 6 and report.groups_dropped == 0


def test_admission_quota_is_the_lookahead_window_when_weights_are_in_sync():
    ctx = PlanContext(batch_groups=4, group_size=1, max_staleness=2, total_steps=100)
    p = Lookahead(ctx)
    d = p.admit(now=0, candidates=[Candidate(i, i) for i in range(50)])
    assert len(d.admit) == 4 * (2 + 1)  # |U| + 1 <= B·(a + η − k + 1) with a = k = 0
    assert [a.planned_step for a in d.admit] == [0] * 4 + [1] * 4 + [2] * 4
    assert all(a.deadline == 2 and a.priority == 2 for a in d.admit)


def test_admission_stops_at_batch_times_steps_so_nothing_is_left_untrained():
    ctx = PlanContext(batch_groups=2, group_size=1, max_staleness=5, total_steps=2)
    p = Lookahead(ctx)
    assert len(p.admit(now=0, candidates=[Candidate(i, i) for i in range(50)]).admit) == 4


def test_a_lagging_weight_sync_shrinks_the_quota():
    ctx = PlanContext(batch_groups=2, group_size=1, max_staleness=1, total_steps=100)
    p = Lookahead(ctx)
    p.admit(now=0, candidates=[Candidate(i, i) for i in range(4)])
    for uid in range(2):
        p.on_group_started(uid=uid, version=0, now=0)
        p.on_group_finished(uid=uid, versions=[(0, 5)], now=0)
    assert p.select_batch(step=0, now=0).train == [0, 1]
    p.on_step_done(step=0, now=0)
    p.on_version_published(version=1, now=0)
    # Workers still hold v0: a new group would have deadline 0+1 = 1, and two groups already do.
    assert p.admit(now=0, candidates=[Candidate(9, 9)]).admit == []
    p.on_version_synced(version=1, now=0)
    assert len(p.admit(now=0, candidates=[Candidate(9, 9), Candidate(10, 10)]).admit) == 2


def test_done_groups_are_pulled_forward_and_the_long_tail_moves_back():
    ctx = PlanContext(batch_groups=2, group_size=1, max_staleness=3, total_steps=100)
    p = Lookahead(ctx)
    p.admit(now=0, candidates=[Candidate(i, i) for i in range(8)])  # steps 0,0,1,1,2,2,3,3
    for uid in (0, 2):  # group 1 (planned at step 0) is slow; group 2 (planned at step 1) is done
        p.on_group_started(uid=uid, version=0, now=0)
        p.on_group_finished(uid=uid, versions=[(0, 5)], now=0)
    d = p.select_batch(step=0, now=0)
    assert d.train == [0, 2]
    assert {(m.uid, m.src, m.dst) for m in d.moves} == {(2, 1, 0), (1, 0, 1)}


def test_the_trainer_waits_for_a_group_whose_deadline_is_now():
    ctx = PlanContext(batch_groups=1, group_size=1, max_staleness=0, total_steps=10)
    p = Lookahead(ctx)
    assert [a.uid for a in p.admit(now=0, candidates=[Candidate(0, 0), Candidate(1, 1)]).admit] == [0]
    assert p.select_batch(step=0, now=0).train is None


def test_a_group_started_on_newer_weights_gets_the_later_deadline():
    ctx = PlanContext(batch_groups=1, group_size=1, max_staleness=1, total_steps=10)
    p = Lookahead(ctx)
    p.admit(now=0, candidates=[Candidate(0, 0)])
    p.on_group_started(uid=0, version=0, now=0)
    p.on_group_finished(uid=0, versions=[(0, 3)], now=0)
    p.select_batch(step=0, now=0)
    p.on_step_done(step=0, now=0)
    p.admit(now=0, candidates=[Candidate(1, 1)])  # admitted at synced v0: deadline 1
    assert p.groups[1].deadline == 1
    p.on_version_published(version=1, now=0)
    p.on_version_synced(version=1, now=0)
    p.on_group_started(uid=1, version=1, now=0)
    assert p.groups[1].deadline == 2


def test_state_dict_round_trip_continues_identically():
    ctx = PlanContext(batch_groups=2, group_size=2, max_staleness=2, total_steps=8)
    with tempfile.TemporaryDirectory() as tmp:
        p = Lookahead(ctx, LookaheadParams(predictor="history"))
        drv = AdversarialDriver(p, Path(tmp), seed=3)
        drv.run(max_events=40)  # stop part-way
        clone = Lookahead(ctx)
        clone.load_state_dict(p.state_dict())
        assert clone.state_dict() == p.state_dict()
        cands = [Candidate(1000 + i, i) for i in range(6)]
        assert clone.admit(now=0, candidates=cands) == p.admit(now=0, candidates=cands)
        if p.batch_pending:
            step = p.step
            assert clone.on_step_done(step=step, now=0) == p.on_step_done(step=step, now=0)
        assert clone.select_batch(step=p.step, now=0) == p.select_batch(step=p.step, now=0)
        assert clone.state_dict() == p.state_dict()


def test_invalid_parameters_are_rejected_with_the_field_name():
    with pytest.raises(ValueError, match="max_inflight_groups"):
        LookaheadParams(max_inflight_groups=0)
    ctx = PlanContext(batch_groups=1, group_size=1, max_staleness=1, total_steps=1)
    with pytest.raises(ValueError, match="policy.bogus"):
        Lookahead.build(ctx, {"bogus": 1})
    with pytest.raises(ValueError, match="predictor"):
        Lookahead(ctx, LookaheadParams(predictor="crystal_ball"))
    with pytest.raises(ValueError, match="max_staleness=-1"):
        PlanContext(batch_groups=1, group_size=1, max_staleness=-1, total_steps=1)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**31), eta=st.integers(0, 3), batch=st.integers(1, 4), steps=st.integers(1, 10),
       extra=st.integers(0, 12), faults=st.booleans(), partial=st.booleans())
def test_an_untrained_cap_keeps_lookahead_strict_without_drops_or_deadlock(seed, eta, batch, steps, extra, faults,
                                                                           partial):
    ctx = PlanContext(batch_groups=batch, group_size=2, max_staleness=eta, total_steps=steps)
    cap = batch + extra
    policy, out, report = run(ctx, seed, LookaheadParams(max_untrained_groups=cap), faults=faults, partial=partial)
    assert not out.deadlock and out.steps == steps
    assert report.ok, report.verdict()
    assert report.max_token_staleness <= eta and report.groups_dropped == 0 and not report.lost
    assert report.groups_trained == batch * steps


def test_the_untrained_cap_bounds_admitted_untrained_groups_not_only_generating_ones():
    ctx = PlanContext(batch_groups=2, group_size=1, max_staleness=3, total_steps=10)
    p = Lookahead(ctx, LookaheadParams(max_untrained_groups=3))
    d = p.admit(now=0, candidates=[Candidate(i, str(i)) for i in range(8)])
    assert len(d.admit) == 3  # the quota alone would admit B·(η+1) = 8
    for a in d.admit:
        p.on_group_started(uid=a.uid, version=0, now=0)
        p.on_group_finished(uid=a.uid, versions=((0, 1),), now=0)
    assert p.inflight == 0 and p.untrained == 3  # done but untrained groups still count
    assert p.admit(now=0, candidates=[Candidate(10, "10")]).admit == []


def test_an_untrained_cap_below_the_batch_is_refused_at_setup():
    ctx = PlanContext(batch_groups=4, group_size=1, max_staleness=1, total_steps=1)
    with pytest.raises(ValueError, match=r"policy.max_untrained_groups=3: must be >= batch_groups=4"):
        Lookahead(ctx, LookaheadParams(max_untrained_groups=3))
