"""Condition (F) and the admission quota of docs/design.md §2.2-§2.3, pinned on hand-made cases and against
a brute force that does not share the prefix-sum argument of `planner/feasibility.py`.

(F) at step k, B groups a step: for every D >= k, |{g in U : d(g) <= D}| <= B·(D − k + 1), and no
untrained group has a deadline before k. The brute force below asks the question (F) answers —
can every group be given its own batch seat at a step in [k, d(g)], B seats a step? — as a
bipartite matching (augmenting paths), so it relies on neither Horn's EDF argument nor prefix sums.
"""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from planner.base import Group
from planner.feasibility import admission_room, feasible, slack
from planner.policies.lookahead import Lookahead, LookaheadParams
from planner.types import Candidate, GroupState, PlanContext

# ---------------------------------------------------------------------------------- brute force


def expand(counts: dict[int, int]) -> list[int]:
    return [d for d, c in counts.items() for _ in range(c)]


def plus(counts: dict[int, int], deadline: int, m: int) -> dict[int, int]:
    out = dict(counts)
    out[deadline] = out.get(deadline, 0) + m
    return out


def max_matching(deadlines: list[int], k: int, batch: int) -> int:
    """Most groups that get a seat (step s, j), k <= s <= own deadline, j < batch: Kuhn's algorithm."""
    if not deadlines:
        return 0
    seats = [s for s in range(k, max(max(deadlines), k) + 1) for _ in range(batch)]
    owner: list[int | None] = [None] * len(seats)

    def augment(g: int, seen: set[int]) -> bool:
        for i, s in enumerate(seats):
            if s <= deadlines[g] and i not in seen:
                seen.add(i)
                if owner[i] is None or augment(owner[i], seen):
                    owner[i] = g
                    return True
        return False

    return sum(augment(g, set()) for g in range(len(deadlines)))


def fits(counts: dict[int, int], k: int, batch: int) -> bool:
    deadlines = expand(counts)
    return max_matching(deadlines, k, batch) == len(deadlines)


def most_extra(counts: dict[int, int], k: int, batch: int, deadline: int) -> int | None:
    """Largest m >= 0 such that m more groups with `deadline` still fit; None if the set does not fit."""
    if not fits(counts, k, batch):
        return None
    ceiling = max(0, batch * (deadline - k + 1))  # more than this many cannot fit in [k, deadline]
    ok = [m for m in range(ceiling + 2) if fits(plus(counts, deadline, m), k, batch)]
    assert ok == list(range(len(ok))), "adding groups can only break a fit"
    return len(ok) - 1


# ---------------------------------------------------------------------------------- strategies


@st.composite
def any_sets(draw):
    """Deadline -> count maps around step k, feasible or not; some deadlines in the past, some zero counts."""
    k = draw(st.integers(0, 6))
    batch = draw(st.integers(1, 4))
    offsets = st.integers(-3, 7)
    counts = draw(st.dictionaries(offsets, st.integers(0, 5), max_size=6))
    return {k + o: c for o, c in counts.items()}, k, batch


@st.composite
def feasible_sets(draw, max_offset: int = 7, k: int | None = None, batch: int | None = None):
    """Feasible by construction: at most B groups seated at each step, each with a deadline at or after its seat."""
    k = draw(st.integers(0, 6)) if k is None else k
    batch = draw(st.integers(1, 4)) if batch is None else batch
    counts: dict[int, int] = {}
    for s in range(k, k + max_offset + 1):
        for _ in range(draw(st.integers(0, batch))):
            d = draw(st.integers(s, k + max_offset))
            counts[d] = counts.get(d, 0) + 1
    for d in draw(st.lists(st.integers(k - 3, k + max_offset + 2), max_size=2)):
        counts.setdefault(d, 0)  # a deadline whose groups were all trained or moved
    order = draw(st.permutations(list(counts)))  # the map's key order must not matter
    return {d: counts[d] for d in order}, k, batch


# ---------------------------------------------------------------------------------- (F): hand-made


def test_a_set_that_exactly_fills_every_slot_up_to_its_deadline_is_feasible_and_one_more_is_not():
    k, B, D = 4, 3, 6
    full = {D: B * (D - k + 1)}  # 9 groups, steps 4, 5, 6, three a step
    assert feasible(full, k, B) and slack(full, k, B) == 0
    assert not feasible({D: 10}, k, B) and slack({D: 10}, k, B) == -1
    # Mixed deadlines that fill every step exactly.
    assert feasible({4: 3, 5: 3, 6: 3}, k, B) and slack({4: 3, 5: 3, 6: 3}, k, B) == 0
    assert not feasible({4: 3, 5: 3, 6: 4}, k, B)


def test_a_deadline_equal_to_the_current_step_has_one_steps_worth_of_slots():
    assert feasible({5: 2}, 5, 2)
    assert not feasible({5: 3}, 5, 2)
    assert not feasible({5: 3, 9: 0}, 5, 2)


def test_every_prefix_of_deadlines_is_checked_not_only_the_total():
    B = 2
    assert not feasible({0: 3, 2: 1}, 0, B)  # 4 groups, 6 slots, but 3 of them due at step 0
    assert not feasible({1: 4, 0: 1}, 0, B)  # D = 1: 5 > 4 (keys out of order on purpose)
    assert feasible({2: 2, 1: 2, 0: 2}, 0, B)
    assert slack({0: 1, 1: 3, 3: 1}, 0, B) == 0  # binding at D = 1: 4 − 4


def test_a_deadline_already_in_the_past_is_infeasible():
    assert not feasible({4: 1}, 5, 10)  # D < k: no step is left to train it
    assert slack({4: 1}, 5, 10) < 0
    assert not feasible({4: 1, 20: 0}, 5, 10)
    assert not feasible({0: 1, 30: 1}, 5, 1)
    assert feasible({5: 1}, 5, 1)


def test_groups_with_far_deadlines_do_not_count_against_an_early_deadline():
    B = 2
    assert feasible({0: B, 9: 18}, 0, B)  # D = 0: 2 <= 2; D = 9: 20 <= 20
    assert slack({0: 1, 9: 5}, 0, B) == 1  # the 5 far groups leave step 0's free seat alone
    assert not feasible({0: B, 9: 19}, 0, B)  # ... but they do count at their own deadline


def test_with_no_groups_the_slack_is_one_steps_worth():
    assert feasible({}, 3, 4) and slack({}, 3, 4) == 4
    assert slack({10: 1}, 3, 4) == 4  # a far group: step 3 is still free


def test_deadlines_whose_groups_are_all_gone_are_ignored_even_in_the_past():
    # L3 checks the residual at k+1 with zero counts left in the map (lookahead.choose_batch).
    assert feasible({2: 0, 5: 2}, 5, 2) and slack({2: 0, 5: 2}, 5, 2) == 0
    assert feasible({0: 0}, 5, 1) and slack({0: 0}, 5, 1) == 1


# ---------------------------------------------------------------------------------- admission_room: hand-made


def assert_room_is_exact(counts, k, B, d, room):
    assert admission_room(counts, k, B, d) == room
    assert feasible(plus(counts, d, room), k, B)
    assert not feasible(plus(counts, d, room + 1), k, B)


def test_admission_room_is_the_free_slots_up_to_the_new_deadline():
    assert_room_is_exact({0: 1, 1: 1}, 0, 2, 2, 4)  # 6 slots in steps 0..2, 2 taken
    assert_room_is_exact({}, 3, 2, 5, 6)
    assert_room_is_exact({3: 2, 4: 2, 5: 2}, 3, 2, 5, 0)


def test_admission_room_is_limited_by_later_deadlines_already_admitted():
    # 4 free slots up to step 1, but the 7 groups due at step 3 need 7 of the 8 slots in 0..3.
    assert_room_is_exact({3: 7}, 0, 2, 1, 1)
    assert_room_is_exact({1: 1, 6: 10}, 0, 2, 1, 3)  # D = 1: 4 − 1; D = 6: 14 − 11 = 3


def test_admission_room_does_not_recheck_full_steps_before_the_new_deadline():
    # Steps 0 and 1 are full; a group due at 3 fits in steps 2..3 regardless.
    assert_room_is_exact({0: 1, 1: 1}, 0, 1, 3, 2)


def test_admission_room_with_a_deadline_in_the_past_admits_nothing():
    assert admission_room({}, 5, 3, 4) <= 0
    assert admission_room({6: 1}, 5, 3, 2) <= 0
    assert admission_room({}, 5, 3, 5) == 3  # at the current step: one step's worth


# ---------------------------------------------------------------------------------- refined deadlines


def test_moving_a_deadline_later_turns_an_overfull_step_feasible():
    B, k = 2, 3
    assert not feasible({k: B + 1}, k, B)
    assert feasible({k: B, k + 1: 1}, k, B)  # one group started on newer weights: deadline start+η


def test_a_refined_deadline_frees_room_at_the_old_deadline():
    # B = 1, η = 1, a = 0: two groups due at 1 fill steps 0 and 1; one refined to 2 frees a seat at 1.
    assert admission_room({1: 2}, 0, 1, 1) == 0
    assert admission_room({1: 1, 2: 1}, 0, 1, 1) == 1
    # ... but not when the binding constraint is the later one.
    assert admission_room({1: 1, 2: 2}, 0, 1, 1) == 0


def test_a_refined_deadline_lets_F_admit_more_but_the_lookahead_quota_does_not():
    ctx = PlanContext(batch_groups=1, group_size=1, max_staleness=1, total_steps=10)
    p = Lookahead(ctx)
    assert [a.deadline for a in p.admit(now=0, candidates=[Candidate(0, 0), Candidate(1, 1)]).admit] == [1, 1]
    p.on_group_started(uid=0, version=0, now=0)
    p.on_group_finished(uid=0, versions=[(0, 3)], now=0)
    assert p.select_batch(step=0, now=0).train == [0]
    p.on_step_done(step=0, now=0)
    p.on_version_published(version=1, now=0)  # synced stays 0: some worker still holds v0
    assert p.admission_quota(now=0) == 0  # step 1 holds group 1 (deadline 1)
    p.on_group_started(uid=1, version=1, now=0)  # a worker that already has v1 starts it
    assert p.counts == {2: 1}
    assert admission_room(p.counts, 1, 1, p.synced + 1) == 1  # (F) alone: one more at deadline 1
    assert p.admission_quota(now=0) == 0  # |U| + 1 <= B·(a + η − k + 1) = 1 does not
    p.on_version_synced(version=1, now=0)
    assert p.admission_quota(now=0) == 1


# ---------------------------------------------------------------------------------- the quota: hand-made


def lookahead_at(*, B, eta, S, k, synced, deadlines, inflight=None, pending=False, cap=None):
    """A `lookahead` whose untrained groups U have `deadlines`, at next batch step k (no drops: A = B·k + |U|)."""
    p = Lookahead(PlanContext(batch_groups=B, group_size=1, max_staleness=eta, total_steps=S),
                  LookaheadParams(max_inflight_groups=cap))
    p.step, p.batch_pending = (k - 1, True) if pending else (k, False)
    p.published = max(p.step, synced)
    p.synced = synced
    inflight = len(deadlines) if inflight is None else inflight
    for uid, d in enumerate(deadlines):
        g = Group(uid, uid, uid, synced if d is None else min(synced, d - eta), 0, deadline=d)
        g.status = GroupState.RUNNING if uid < inflight else GroupState.DONE
        p.groups[uid] = g
        if g.status == GroupState.DONE:
            g.finish_seq = uid
            p._done[uid] = g
    p._inflight = inflight
    p.admitted_total = B * k + len(deadlines)
    if eta is not None:
        p.counts = dict(Counter(deadlines))
    assert p.next_batch_step == k and p.untrained == len(deadlines)
    return p


def test_the_quota_admits_exactly_up_to_the_lookahead_window():
    # k = a = 2, η = 2, B = 3: |U| + m <= 3·(2 + 2 − 2 + 1) = 9.
    p = lookahead_at(B=3, eta=2, S=100, k=2, synced=2, deadlines=[2, 2, 3, 3, 4])
    assert p.admission_quota(now=0) == 4
    assert admission_room(p.counts, 2, 3, 4) == 4  # unrefined deadlines: the quota equals room_F
    assert len(p.admit(now=0, candidates=[Candidate(100 + i, i) for i in range(10)]).admit) == 4
    assert p.untrained == 9 and p.admission_quota(now=0) == 0


def test_the_quota_is_the_lookahead_window_not_F_when_deadlines_are_refined():
    # k = 1, synced = 0, η = 1, B = 2; two of the three groups started on v1 (deadline 2).
    p = lookahead_at(B=2, eta=1, S=100, k=1, synced=0, deadlines=[1, 2, 2])
    assert admission_room(p.counts, 1, 2, 1) == 1  # (F) alone would admit one more at deadline 1
    assert p.admission_quota(now=0) == 0  # 3 + 1 > 2·(0 + 1 − 1 + 1)


def test_while_a_batch_trains_the_window_starts_at_the_next_step():
    idle = lookahead_at(B=2, eta=2, S=100, k=3, synced=3, deadlines=[3, 4])
    training = lookahead_at(B=2, eta=2, S=100, k=4, synced=3, deadlines=[4, 4], pending=True)
    assert idle.admission_quota(now=0) == 2 * (3 + 2 - 3 + 1) - 2 == 4
    assert training.admission_quota(now=0) == 2 * (3 + 2 - 4 + 1) - 2 == 2


def test_a_sync_lagging_past_the_window_admits_nothing():
    p = lookahead_at(B=2, eta=1, S=100, k=3, synced=0, deadlines=[])  # a new group would be due at 1 < 3
    assert p.admission_quota(now=0) == 0
    assert p.admit(now=0, candidates=[Candidate(7, 7)]).admit == []


def test_the_quota_never_exceeds_what_the_run_still_trains():
    # B·S − A = 2·3 − (2·2 + 1) = 1, although the window (η = 3) would allow 7.
    p = lookahead_at(B=2, eta=3, S=3, k=2, synced=2, deadlines=[2])
    assert p.admission_quota(now=0) == 1
    assert lookahead_at(B=2, eta=3, S=3, k=2, synced=2, deadlines=[2, 3]).admission_quota(now=0) == 0


def test_max_inflight_groups_caps_the_quota_and_done_groups_do_not_count_against_it():
    p = lookahead_at(B=4, eta=2, S=100, k=0, synced=0, deadlines=[0, 0, 1, 1], inflight=2, cap=3)
    assert p.admission_quota(now=0) == 1  # window 12 − 4 = 8, room_F 8, cap 3 − 2 in flight
    p = lookahead_at(B=4, eta=2, S=100, k=0, synced=0, deadlines=[0, 0, 1, 1], inflight=4, cap=3)
    assert p.admission_quota(now=0) == 0  # over the cap: nothing, never a negative quota


def test_without_a_bound_the_quota_is_only_the_run_total_and_the_cap():
    p = lookahead_at(B=2, eta=None, S=5, k=1, synced=1, deadlines=[None] * 3)
    assert p.admission_quota(now=0) == 2 * 5 - (2 + 3)
    p = lookahead_at(B=2, eta=None, S=5, k=1, synced=1, deadlines=[None] * 3, inflight=1, cap=2)
    assert p.admission_quota(now=0) == 1


# ---------------------------------------------------------------------------------- brute-force properties


@settings(max_examples=400, deadline=None)
@given(case=any_sets())
def test_feasible_agrees_with_a_brute_force_seat_assignment(case):
    counts, k, B = case
    expected = fits(counts, k, B)
    event("feasible" if expected else "infeasible")
    assert feasible(counts, k, B) == expected
    assert (slack(counts, k, B) >= 0) == expected


@settings(max_examples=300, deadline=None)
@given(case=any_sets())
def test_slack_is_the_room_at_the_current_step_or_minus_the_groups_that_cannot_be_seated(case):
    counts, k, B = case
    s = slack(counts, k, B)
    room = most_extra(counts, k, B, k)
    if room is not None:
        assert s == room  # feasible: how many more groups due at k still fit
    elif all(d >= k for d, c in counts.items() if c):
        deadlines = expand(counts)
        assert s == max_matching(deadlines, k, B) - len(deadlines)  # König: the deficiency
    else:
        assert s < 0


@settings(max_examples=300, deadline=None)
@given(case=feasible_sets(), offset=st.integers(-2, 8))
def test_admission_room_is_the_most_groups_that_keep_F_by_brute_force(case, offset):
    counts, k, B = case
    d = k + offset
    room = admission_room(counts, k, B, d)
    assert max(0, room) == most_extra(counts, k, B, d)
    if d >= k:
        assert room >= 0  # (F) holds, so the check at D = d itself leaves room >= 0
    else:
        assert room <= 0


@settings(max_examples=200, deadline=None)
@given(case=feasible_sets(), data=st.data())
def test_moving_any_deadline_later_never_breaks_F_nor_shrinks_any_room(case, data):
    counts, k, B = case
    live = [d for d, c in counts.items() if c]
    if not live:
        return
    old = data.draw(st.sampled_from(live))
    new = old + data.draw(st.integers(1, 3))
    moved = plus(plus(counts, old, -1), new, 1)
    assert feasible(moved, k, B) and fits(moved, k, B)
    assert slack(moved, k, B) >= slack(counts, k, B)
    for d in range(k, k + 10):
        assert admission_room(moved, k, B, d) >= admission_room(counts, k, B, d)


@settings(max_examples=200, deadline=None)
@given(case=feasible_sets(), offset=st.integers(-2, 8))
def test_the_lookahead_window_never_exceeds_room_F(case, offset):
    """B·(d − k + 1) − |U| <= room_F(d) for every feasible U: the window quota alone keeps (F) (docs/design.md §2.8 (i))."""
    counts, k, B = case
    d = k + offset
    window = B * (d - k + 1) - sum(counts.values())
    assert window <= admission_room(counts, k, B, d)
    if window >= 0:
        assert fits(plus(counts, d, window), k, B)


@st.composite
def quota_states(draw):
    B = draw(st.integers(1, 3))
    eta = draw(st.integers(0, 3))
    k = draw(st.integers(0, 5))
    pending = k > 0 and draw(st.booleans())
    synced = draw(st.integers(max(0, k - eta - 2), k))
    # U: feasible at k, deadlines in [k, k + η] (refined ones up to published + η <= k + η).
    counts, _, _ = draw(feasible_sets(max_offset=eta, k=k, batch=B))
    deadlines = sorted(expand(counts))
    S = draw(st.integers(k + 1, k + eta + 3))
    if B * k + len(deadlines) > B * S:  # a run admits at most B·S groups
        S = k + -(-len(deadlines) // B)
    inflight = draw(st.integers(0, len(deadlines)))
    cap = draw(st.none() | st.integers(1, 2 * B + 2))
    return dict(B=B, eta=eta, S=S, k=k, synced=synced, deadlines=deadlines, inflight=inflight, pending=pending, cap=cap)


@settings(max_examples=300, deadline=None)
@given(state=quota_states())
def test_the_quota_is_the_most_groups_due_at_a_plus_eta_that_every_rule_admits_by_brute_force(state):
    p = lookahead_at(**state)
    B, k, a, eta, S = state["B"], state["k"], state["synced"], state["eta"], state["S"]
    U, cap = state["deadlines"], state["cap"]
    counts = dict(Counter(U))
    d = a + eta

    def admissible(m: int) -> bool:
        return (
            B * k + len(U) + m <= B * S  # the run total
            and fits(plus(counts, d, m), k, B)  # (F)
            and len(U) + m <= B * (a + eta - k + 1)  # the lookahead quota
            and (cap is None or state["inflight"] + m <= cap)
        )

    m = 0
    while admissible(m + 1):
        m += 1
    expected = m if admissible(0) else 0  # every rule only gets stricter as m grows
    binding = [name for name, v in [("run total", B * S - B * k - len(U)), ("(F)", most_extra(counts, k, B, d)),
               ("window", B * (a + eta - k + 1) - len(U)), ("cap", None if cap is None else cap - state["inflight"])]
               if v is not None and max(0, v) == expected]
    event(f"quota {'> 0' if expected else '= 0'}, bound by " + " and ".join(binding))
    assert p.admission_quota(now=0) == expected
    # Admitting that many keeps (F) (docs/design.md §2.8 (i)): the lookahead quota is never above room_F.
    admitted = p.admit(now=0, candidates=[Candidate(1000 + i, i) for i in range(expected + 3)]).admit
    assert len(admitted) == expected and all(x.deadline == d for x in admitted)
    assert fits(p.counts, k, B)


def test_the_brute_force_oracle_agrees_with_hand_counts_on_tight_cases():
    assert fits({1: 2, 2: 2}, 1, 2) and not fits({1: 3, 2: 1}, 1, 2)
    assert max_matching([0, 0, 0], 0, 2) == 2 and most_extra({3: 7}, 0, 2, 1) == 1


@pytest.mark.parametrize("k,B", [(0, 1), (3, 2)])
def test_the_brute_force_rejects_a_past_deadline(k, B):
    assert not fits({k - 1: 1}, k, B) and fits({k - 1: 0, k: B}, k, B)
