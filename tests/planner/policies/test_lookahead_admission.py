"""Lookahead's admission details that the bound alone does not pin: candidate order with a
predictor (longest first, no starvation), the KV token budget, where a new group is planned, and
the one-line errors of its parameters."""

from __future__ import annotations

import pytest

from planner.policies.lookahead import Lookahead, LookaheadParams
from planner.types import Candidate, PlanContext


def planner(B=4, eta=4, n=2, **params) -> Lookahead:
    return Lookahead(PlanContext(batch_groups=B, group_size=n, max_staleness=eta, total_steps=50),
                     LookaheadParams(**params))


def cands(*tokens, first_uid=0):
    return [Candidate(first_uid + i, f"p{first_uid + i}", oracle_tokens=t) for i, t in enumerate(tokens)]


def finish(p, uid, tokens):
    p.on_group_started(uid=uid, version=0, now=0)
    p.on_group_finished(uid=uid, versions=[(0, tokens)], now=0)


def test_with_a_predictor_the_longest_candidates_go_first_and_without_one_the_stream_order_stays():
    assert [c.uid for c in planner(predictor="oracle").order_candidates(cands(5, 50, 20))] == [1, 2, 0]
    assert [c.uid for c in planner().order_candidates(cands(5, 50, 20))] == [0, 1, 2]
    single = cands(5)
    assert planner(predictor="oracle").order_candidates(single) is single
    # No prediction (oracle_tokens unknown) counts as 0 tokens: after every predicted one.
    assert [c.uid for c in planner(predictor="oracle").order_candidates(cands(None, 3))] == [1, 0]


def test_a_candidate_passed_over_for_a_whole_window_goes_first_whatever_its_length():
    # Window of 3, newest uid 11: uid 0 is older than 11 − 2·3 = 5, so it goes first; uid 10 does not.
    window = [Candidate(0, "a", oracle_tokens=1), Candidate(10, "b", oracle_tokens=5), Candidate(11, "c", oracle_tokens=50)]
    assert [c.uid for c in planner(predictor="oracle").order_candidates(window)] == [0, 11, 10]
    window = [Candidate(5, "a", oracle_tokens=1), Candidate(10, "b", oracle_tokens=5), Candidate(11, "c", oracle_tokens=50)]
    assert [c.uid for c in planner(predictor="oracle").order_candidates(window)] == [11, 10, 5]  # 5 is not older


def test_the_kv_token_budget_admits_while_predicted_tokens_fit_and_an_idle_engine_always_takes_one():
    p = planner(predictor="oracle", kv_token_budget=120)  # n = 2: a 30-token prediction is 60 tokens
    assert [a.uid for a in p.admit(now=0, candidates=cands(30, 30, 30)).admit] == [0, 1]  # 120 fits, 180 not
    assert p._inflight_tokens == 120
    assert p.admit(now=0, candidates=cands(30, first_uid=2)).admit == []  # engine busy: the budget holds
    finish(p, 0, 40)
    assert p._inflight_tokens == 60
    assert [a.uid for a in p.admit(now=0, candidates=cands(30, first_uid=2)).admit] == [2]
    # A group longer than the whole budget still starts on an idle engine (it cannot stall the run).
    q = planner(predictor="oracle", kv_token_budget=10)
    assert [a.uid for a in q.admit(now=0, candidates=cands(30, 30)).admit] == [0]
    finish(q, 0, 5)
    assert q.inflight == 0 and [a.uid for a in q.admit(now=0, candidates=cands(30, first_uid=1)).admit] == [1]


def test_a_group_without_a_prediction_adds_no_tokens_and_a_late_duplicate_finish_changes_nothing():
    p = planner(predictor="oracle", kv_token_budget=100)
    p.admit(now=0, candidates=cands(None, 10))
    assert p._inflight_tokens == 20
    finish(p, 0, 3)
    finish(p, 1, 3)
    assert p._inflight_tokens == 0 and len(p._ready) == 2
    p.on_group_finished(uid=1, versions=[(0, 3)], now=0)  # a duplicate report for a done group
    assert p._inflight_tokens == 0 and len(p._ready) == 2 and p.num_done == 2


def test_the_history_predictor_learns_the_per_sample_length_of_each_finished_group():
    p = planner(predictor="history")
    p.admit(now=0, candidates=[Candidate(0, "q")])
    finish(p, 0, 8)  # 8 tokens over n = 2 samples
    assert p.predict(Candidate(9, "q")) == 4.0
    p.on_group_finished(uid=0, versions=[(0, 100)], now=0, last_versions=[0, 0])  # late duplicate: not observed
    assert p.predict(Candidate(9, "q")) == 4.0


def test_the_finish_keeps_each_samples_last_version():
    p = planner()
    p.admit(now=0, candidates=[Candidate(0, "q")])
    p.on_group_started(uid=0, version=0, now=0)
    p.on_group_finished(uid=0, versions=[(0, 2), (1, 3)], now=0, last_versions=[0, 1])
    assert p.groups[0].last_versions == (0, 1)


def test_a_new_group_is_planned_at_the_first_open_step_from_the_next_batch_not_a_trained_one():
    p = planner(B=1, eta=2, n=1)
    (a,) = p.admit(now=0, candidates=[Candidate(0, 0)]).admit
    assert a.planned_step == 0
    finish(p, 0, 1)
    assert p.select_batch(step=0, now=0).train == [0]
    p.on_step_done(step=0, now=0)
    admitted = p.admit(now=0, candidates=[Candidate(1, 1), Candidate(2, 2)]).admit
    assert [(x.uid, x.planned_step) for x in admitted] == [(1, 1), (2, 2)]
    assert p.plan == {1: {1}, 2: {2}}


@pytest.mark.parametrize("name", ["max_inflight_groups", "kv_token_budget"])
def test_a_non_positive_cap_is_a_one_line_error_naming_the_key_and_value(name):
    with pytest.raises(ValueError, match=rf"^policy\.{name}=0: must be positive or null$"):
        LookaheadParams(**{name: 0})
    assert getattr(LookaheadParams(**{name: 1}), name) == 1
