"""Speculative decoding in the worker model, against hand-computed times.

acceptance 0.5, tokens 1: a speculating sequence emits (1 − 0.5²)/(1 − 0.5) = 1.5 tokens a step;
draft_cost 0.5: a speculating step's fixed part is α·(1 + 0.5·1) = 1.5 s (α = 1, β = 0.5).
"""

import pytest

from planner.sim.config import SpeculationSimConfig, WorkerConfig
from planner.sim.group import SimGroup
from planner.sim.workers import Worker
from planner.types import GroupState


def worker(when, **spec):
    speculation = SpeculationSimConfig(when=when, acceptance=0.5, tokens=1, draft_cost=0.5, **spec)
    return Worker(0, WorkerConfig(num_workers=1, decode_alpha=1.0, decode_beta=0.5, prefill_per_token=0.0,
                                  t_sync=0.0, speculation=speculation))


def group(uid, lengths, critical=False):
    g = SimGroup(uid, uid, 0, list(lengths))
    g.seq, g.critical = uid, critical
    return g


def test_the_expected_accepted_run_is_the_standard_formula():
    assert SpeculationSimConfig(acceptance=0.5, tokens=1).rate == pytest.approx(1.5)
    assert SpeculationSimConfig(acceptance=0.7, tokens=4).rate == pytest.approx((1 - 0.7 ** 5) / 0.3)
    assert SpeculationSimConfig(acceptance=1.0, tokens=4).rate == 5.0
    assert SpeculationSimConfig(acceptance=0.0, tokens=4).rate == 1.0  # every draft rejected: one token a step


def test_always_speculating_sequences_advance_by_the_accepted_run_at_the_drafted_step_cost():
    w = worker("always")
    w.enqueue(group(0, [3, 6]))
    w.start_queued(0.0)
    # two active: a step costs 1.5 + 0.5·2 = 2.5 s; 3 tokens at 1.5 a step: 2 steps
    assert w.next_completion() == pytest.approx(5.0)
    assert w.complete(5.0) == []
    # one active: 2.0 s a step; 3 tokens left: 2 more steps
    assert w.next_completion() == pytest.approx(9.0)
    (done,) = w.complete(9.0)
    assert done.state == GroupState.DONE and done.versions == {0: 9} and w.spec_active == 0


def test_a_crowded_worker_decodes_plainly_until_it_is_weight_bound():
    w = worker("always", max_active=1)
    w.enqueue(group(0, [3, 6]))
    w.start_queued(0.0)
    # two active > max_active 1: plain steps of 1 + 0.5·2 = 2 s, one token each: the short one ends at 6 s
    assert w.next_completion() == pytest.approx(6.0)
    w.complete(6.0)
    # one active: speculating, 2.0 s a step, 3 tokens left at 1.5 a step
    assert w.next_completion() == pytest.approx(10.0)
    (done,) = w.complete(10.0)
    assert done.versions == {0: 9}


def test_a_group_marked_mid_run_speculates_from_then_on_and_keeps_its_tokens_booked():
    w = worker("critical")
    g = group(0, [6])
    w.enqueue(g)
    w.start_queued(0.0)
    assert w.next_completion() == pytest.approx(9.0)  # plain: 6 steps of 1.5 s
    w.apply_version(3.0, 1)  # 2 tokens on version 0 (t_sync 0: no stall)
    assert w.make_fast(3.0, g)
    assert not w.make_fast(3.0, g)  # already fast
    # 4 tokens left at 1.5 a step, 2.0 s a step
    assert w.next_completion() == pytest.approx(3.0 + 4 / 1.5 * 2.0)
    (done,) = w.complete(w.next_completion())
    assert done.versions == {0: 2, 1: 4}  # every token kept its version


def test_under_never_or_critical_an_unmarked_group_decodes_plainly():
    for when, critical in (("never", True), ("critical", False)):
        w = worker(when)
        w.enqueue(group(0, [6], critical=critical))
        w.start_queued(0.0)
        assert w.next_completion() == pytest.approx(9.0) and w.spec_active == 0


def test_marking_books_the_tokens_so_far_on_the_current_version():
    w = worker("critical")
    g = group(0, [6])
    w.enqueue(g)
    w.start_queued(0.0)
    assert w.make_fast(3.0, g)  # 2 plain tokens so far, none booked yet
    (done,) = w.complete(w.next_completion())
    assert done.versions == {0: 6}


def test_a_weight_load_mid_run_books_the_speculated_tokens_to_the_old_version():
    w = worker("always")
    w.enqueue(group(0, [6]))
    w.start_queued(0.0)
    booked = w.apply_version(4.0, 1)  # 2 steps of 2.0 s at 1.5 tokens a step: 3 tokens on version 0
    assert [(g.uid, v, t) for g, v, t in booked] == [(0, 0, 3)]
    (done,) = w.complete(w.next_completion())
    assert done.versions == {0: 3, 1: 3}
