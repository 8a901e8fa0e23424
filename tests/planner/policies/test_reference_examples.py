"""The worked examples of the reference analysis (docs/design.md §3), reproduced with the scripted driver.

Each test names the framework and the passage of `shared/reference/000_fd4b886cabb725f0.txt` it
reproduces; versions are written vK as there.
"""

from __future__ import annotations

from planner.registry import make_policy
from planner.types import PlanContext
from tests.helpers.scripted import ScriptedDriver


def driver(name, *, B, eta=None, n=1, steps=100, autostart=True, **overrides):
    ctx = PlanContext(batch_groups=B, group_size=n, max_staleness=eta, total_steps=steps)
    return ScriptedDriver(make_policy(name, ctx, overrides), autostart=autostart)


# ----------------------------------------------------------------------------------- verl
def test_verl_prefetches_sixteen_plus_four_then_four_a_step():
    for name in ("verl_drop", "verl_wait"):
        d = driver(name, B=4, num_warmup_batches=4, max_off_policy_threshold=10)
        assert len(d.admitted) == 4 * 4 + 4
        for k in range(3):
            d.finish_all()
            assert d.train_step() is not None
            assert len(d.admitted) == 20 + 4 * (k + 1)


def test_verl_wait_trains_v0_groups_at_the_fifth_batch_with_staleness_four_above_threshold_three():
    d = driver("verl_wait", B=4, num_warmup_batches=4, max_off_policy_threshold=3)
    first_twenty = set(d.admitted)
    for _ in range(5):
        d.finish_all()  # every group finishes at once on the version it started with
        assert d.train_step() is not None
    fifth = d.trained_at(4)
    assert {t.uid for t in fifth} <= first_twenty
    assert all(t.versions.keys() == {0} for t in fifth)
    assert d.max_staleness == 4 > 3


def test_verl_wait_stalls_for_an_unfinished_group_at_the_threshold_even_with_a_batch_done():
    d = driver("verl_wait", B=4, num_warmup_batches=4, max_off_policy_threshold=3)
    slow = d.admitted[0]
    for _ in range(2):
        d.finish_all([u for u in d.running if u != slow])
        assert d.train_step() is not None
    d.finish_all([u for u in d.running if u != slow])
    assert len(d.done) >= 4 and d.train_step() is None  # step 2: 2 − 0 + 1 ≥ 3 for the slow group
    d.finish(slow)
    assert d.train_step() is not None


def test_verl_drop_drops_groups_past_the_threshold_and_readmits_as_many():
    d = driver("verl_drop", B=4, num_warmup_batches=4, max_off_policy_threshold=3)
    for _ in range(6):
        d.finish_all()
        assert d.train_step() is not None
    reasons = set(d.dropped.values())
    assert reasons == {"verl_off_policy_threshold"}
    # 20 + 4 a step, plus one re-admission per drop
    assert len(d.admitted) == 20 + 4 * 6 + len(d.dropped)
    assert d.max_staleness <= 3


# ----------------------------------------------------------------------------------- L1 only
def test_one_slow_v0_group_among_eight_slots_reaches_staleness_five_under_l1_only_control():
    # AReaL, max_head_offpolicyness=1, 8 concurrent slots, batches of 7: the slow v0 group holds one
    # slot while the other seven keep the trainer moving up to v5.
    d = driver("areal", B=7, max_head_offpolicyness=1, max_concurrent_rollouts=8)
    assert len(d.admitted) == 8
    slow = d.admitted[0]
    for _ in range(5):
        d.finish_all([u for u in d.running if u != slow])
        assert d.train_step() is not None
    assert d.synced == 5 and slow in d.running
    d.finish(slow)
    d.finish_all()
    assert d.train_step() is not None
    trained_slow = next(t for t in d.trained if t.uid == slow)
    assert (trained_slow.step, trained_slow.staleness) == (5, 5)


# ----------------------------------------------------------------------------------- AReaL
def test_areal_admits_64_at_v0_nothing_on_completion_and_32_more_at_v1():
    d = driver("areal", B=32, max_head_offpolicyness=1, max_concurrent_rollouts=1000)
    assert len(d.admitted) == 64
    d.finish_all()
    assert len(d.admitted) == 64  # completion moves running → accepted: no new capacity
    assert d.train_step() is not None
    assert len(d.admitted) == 96


# ----------------------------------------------------------------------------------- ROLL
def test_roll_first_round_quota_is_batch_plus_ceil_batch_times_ratio():
    d = driver("roll", B=32, async_generation_ratio=2)
    assert len(d.admitted) == 32 + 64
    d.finish_all()
    d.train_step()
    assert len(d.admitted) == 96 + 32


def test_roll_ratio_two_trains_v3_to_v5_at_v5_and_cancels_older_starts():
    d = driver("roll", B=3, async_generation_ratio=2, autostart=False)
    r_v2, r_v3, r_v4, r_v3_running = d.queued[:4]
    late_starts = {2: [r_v2], 3: [r_v3, r_v3_running], 4: [r_v4]}
    for k in range(5):
        for uid in late_starts.get(k, []):
            d.start(uid, version=k)
        fresh = [u for u in d.queued if u not in (r_v2, r_v3, r_v4, r_v3_running)][:3]
        for uid in fresh:
            d.start(uid, version=k)
            d.finish(uid)
        assert sorted(d.train_step()) == sorted(fresh)
        if k == 4:  # sampled at v4: starts before v3 can never train at v5
            assert d.dropped == {r_v2: "roll_l2_cancel"}
    d.finish(r_v3)
    d.finish(r_v4)
    fresh = [u for u in d.queued if u != r_v3_running][:3]
    for uid in fresh:
        d.start(uid, version=5)
        d.finish(uid)
    batch = d.train_step()
    assert batch == [r_v3, r_v4, fresh[0]]  # oldest allowed start first: v3, v4, then v5
    assert [min(t.versions) for t in d.trained_at(5)] == [3, 4, 5]
    assert d.dropped[r_v3_running] == "roll_l2_cancel"  # sampled at v5: v3 starts are cancelled
    assert d.max_staleness <= 2


# ----------------------------------------------------------------------------------- prime-rl
def test_prime_rl_at_v5_with_two_off_policy_steps_accepts_earliest_version_three_and_up():
    d = driver("prime_rl", B=1, max_off_policy_steps=2, initial_inflight=20, max_inflight=20, autostart=False)
    r2_done, r2_running, r3, r4 = d.queued[:4]
    reserved = {r2_done, r2_running, r3, r4}
    for k in range(5):
        for uid, at in ((r2_done, 2), (r2_running, 2), (r3, 3), (r4, 4)):
            if at == k:
                d.start(uid, version=k)
        fresh = next(u for u in d.queued if u not in reserved)
        d.start(fresh, version=k)
        d.finish(fresh)
        if k == 4:
            d.finish(r2_done)  # queued behind the fresh group, rechecked when v5 is published
        assert d.train_step() == [fresh]
    assert d.dropped == {r2_running: "prime_rl_l2_cancel", r2_done: "prime_rl_l3_stale"}
    d.finish(r3)
    d.finish(r4)
    assert d.train_step() == [r3]  # min_fresh_version at v5 is 3
    assert d.train_step() == [r4]
    assert d.max_staleness == 2


def test_prime_rl_cap_grows_without_queue_under_the_soft_cap_and_shrinks_above_it():
    d = driver("prime_rl", B=2, max_off_policy_steps=1, initial_inflight=4, max_inflight=10, min_inflight=2)
    assert len(d.running) == 4
    d.engine_stats(kv_usage=0.0, queued=0)
    assert len(d.running) == 5  # 4 · 1.25
    d.engine_stats(kv_usage=0.5, queued=3)  # a queue: hold
    assert d.policy.cap == 5
    for _ in range(20):
        d.engine_stats(kv_usage=0.0, queued=0)
    assert d.policy.cap == 10 and len(d.running) == 10
    d.engine_stats(kv_usage=0.95, queued=0)
    assert d.policy.cap == 7.5
    for _ in range(20):
        d.engine_stats(kv_usage=0.95, queued=0)
    assert d.policy.cap == 2


# ----------------------------------------------------------------------------------- Dressage
def test_dressage_window_follows_first_appearance_and_drops_collected_groups_outside_it():
    d = driver("dressage", B=6, n=2, dressage_staleness_keep_versions=2, max_active_groups=10)
    a, b, c, old_again, e, f = d.admitted[:6]
    d.finish(a, {1: 5}, last_versions=(1, 1))
    d.finish(b, {1: 2, 2: 3}, last_versions=(2, 2))
    assert d.train_step() is None and d.policy.collected == [a, b]  # v1, v2: both kept
    d.finish(c, {3: 4}, last_versions=(3, 3))
    assert d.train_step() is None
    assert d.dropped == {a: "dressage_keep_versions"}  # v3 appeared: keep v2, v3
    assert d.policy.collected == [b, c]
    d.finish(old_again, {1: 4}, last_versions=(1, 1))  # an old label seen again does not reorder
    assert d.train_step() is None and old_again in d.dropped
    d.finish(e, {0: 4}, last_versions=(0, 0))  # a label first seen now counts as newest
    assert d.train_step() is None
    assert list(d.policy.versions_seen) == [1, 2, 3, 0]
    assert b in d.dropped and d.policy.collected == [c, e]
    d.finish(f, {3: 1, 1: 4}, last_versions=(3, 1))  # any trajectory outside drops the group
    assert d.train_step() is None and f in d.dropped


def test_dressage_aborts_a_partial_rollout_using_more_than_preempts_plus_one_versions():
    d = driver("dressage", B=1, dressage_staleness_keep_versions=3, max_partial_rollout_preempts=1)
    uid = d.admitted[0]
    d.tokens(uid, 3, version=0)
    d.tokens(uid, 3, version=1)
    assert uid in d.running
    d.tokens(uid, 3, version=2)
    assert d.dropped == {uid: "dressage_partial_rollout_preempts"}


# ----------------------------------------------------------------------------------- NeMo-RL
def test_nemo_in_order_binds_each_admitted_batch_to_a_step_and_takes_only_that_batch():
    d = driver("nemo_in_order", B=2, max_lookahead_versions=2)
    assert len(d.admitted) == 6
    targets = [d.trace[0][1][i][3] for i in range(6)]
    assert targets == [0, 0, 1, 1, 2, 2]
    batch0, batch1, batch2 = d.admitted[0:2], d.admitted[2:4], d.admitted[4:6]
    d.finish_all(batch2 + batch1)
    assert d.train_step() is None  # step 0 waits for its own batch
    d.finish_all(batch0)
    assert d.train_step() == batch0
    assert d.train_step() == batch1
    assert d.train_step() == batch2  # done early, still trained at its bound step 2


def test_nemo_weight_fifo_takes_any_done_v0_groups_during_warmup_while_in_order_waits():
    fifo = driver("nemo_weight_fifo", B=2, max_staleness_versions=2)
    in_order = driver("nemo_in_order", B=2, max_lookahead_versions=2)
    for d in (fifo, in_order):
        assert len(d.admitted) == 6 and set(d.start_versions.values()) == {0}  # η + 1 batches on v0
        d.finish_all(d.admitted[4:6])
    assert fifo.train_step() == fifo.admitted[4:6]
    assert in_order.train_step() is None


def test_nemo_weight_fifo_waits_for_the_oldest_version_rather_than_fill_with_newer_groups():
    d = driver("nemo_weight_fifo", B=2, max_staleness_versions=1)
    v0 = list(d.admitted)
    d.finish_all(v0[:2])
    assert d.train_step() == v0[:2]
    d.finish_all([u for u in d.running if u not in v0])  # the v1 batch finishes first
    assert d.train_step() is None  # v0 stragglers still generating: wait
    d.finish_all(v0[2:])
    assert d.train_step() == v0[2:]


def test_nemo_windowed_aborts_before_sync_and_evicts_done_groups_below_the_window():
    d = driver("nemo_windowed", B=1, max_staleness_versions=1, max_inflight_prompts=4, max_buffered_rollouts=4)
    v0 = list(d.admitted)
    for _ in range(2):
        fresh = max(d.running)
        d.finish(fresh)
        assert d.train_step() == [fresh]
    # publishing v2 aborts the v0 starts still generating (2 − 1 > 0)
    assert d.dropped == {uid: "nemo_abort_inflight" for uid in v0[:-1]}
    fresh, slow_v1 = [u for u in d.running if d.start_versions[u] == 1][:2]  # started before v2 synced
    d.finish(fresh)
    d.finish(slow_v1)  # done behind `fresh`: not taken at step 2
    assert d.train_step() == [fresh]
    assert d.train_step() is None  # at step 3 the window is [2, 3]
    assert d.dropped[slow_v1] == "nemo_evict_stale"
    assert d.max_staleness <= 1


def test_nemo_ready_first_lets_a_fast_later_group_overtake_a_slow_one():
    d = driver("nemo_ready_first", B=1, max_staleness_versions=1)
    slow = d.admitted[0]
    for _ in range(4):
        d.finish_all([u for u in d.running if u != slow])
        assert d.train_step() is not None
    d.finish(slow)
    while slow not in {t.uid for t in d.trained}:
        d.finish_all()
        d.train_step()
    assert d.max_staleness > 1
