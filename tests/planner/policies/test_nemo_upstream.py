"""NeMo-RL's own sampler unit tests, ported onto our policy API.

Upstream: NVIDIA-NeMo/RL `tests/unit/single_controller/test_sampler_interface.py` over
`nemo_rl/algorithms/async_utils/staleness_sampler.py`. Each test names the upstream test it
ports. Upstream drives a sampler over a hand-built `FakeBuffer` (parallel lists of start weight,
ready flag and target step, in reservation order); the fake here is the same table loaded into a
policy through its own checkpoint API (`load_state_dict`): one group per buffer slot, its
admission (dispatch) version the slot's weight, its admission order the buffer order, and — so
that dispatch order and completion order can be told apart — completion in the *reverse* order.
`select(current_train_weight=k, min=max=n)` is our `select_batch(step=k)` with B = n; upstream's
evict runs inside our selection, before the batch is taken.

Not ported (docs/baselines.md says why): `TestCustomFqnSampler` and the FQN part of
`TestDispatchCursorRestore` (a policy is added by `@register`, not loaded by module path),
`test_negative_resume_step_rejected` (the dispatch cursor is restored from a checkpoint, never
set by hand).
"""

from __future__ import annotations

import dataclasses
import json

import pytest

from planner.base import Group, Policy
from planner.registry import make_policy, policy_class
from planner.types import GroupState, PlanContext
from tests.helpers.scripted import ScriptedDriver

SAMPLERS = ("nemo_windowed", "nemo_ready_first", "nemo_weight_fifo", "nemo_in_order")


def ctx(B: int, eta: int | None = None) -> PlanContext:
    return PlanContext(batch_groups=B, group_size=1, max_staleness=eta, total_steps=100)


def fake_buffer(name: str, *, B: int, step: int, slots: list[tuple], **params):
    """A policy at trainer step `step` whose untrained groups are `slots`, in buffer order:
    (label, weight[, ready=True[, target_step=None]]). Ready groups finish in reverse buffer order."""
    policy = make_policy(name, ctx(B), params)
    rows = [tuple(s) + (True, None)[len(s) - 2:] for s in slots]
    ready = [i for i, (_, _, r, _) in enumerate(rows) if r]
    finish = {uid: n for n, uid in enumerate(reversed(ready))}
    groups = []
    for uid, (label, weight, is_ready, target) in enumerate(rows):
        g = Group(uid, label, seq=uid, admit_version=weight, admit_step=min(weight, step),
                  status=GroupState.DONE if is_ready else GroupState.RUNNING, start_version=weight,
                  planned_step=target, versions={weight: 1} if is_ready else {}, finish_seq=finish.get(uid))
        g.last_versions = (weight,) if is_ready else ()
        groups.append(g.to_json())
    state = policy.state_dict()
    state["scalars"].update(step=step, published=step, synced=step, admitted_total=len(rows), _seq=len(rows),
                            _finish_seq=len(ready), trained_total=0, dropped_total=0)
    state["groups"] = groups
    state["done_order"] = sorted(ready, key=finish.get)
    policy.load_state_dict(json.loads(json.dumps(state)))
    return policy


def select(policy, step: int) -> tuple[list[str] | None, list[str], list[str]]:
    """(labels trained or None, labels dropped, labels left) after `select_batch(step)`."""
    labels = {uid: g.prompt_id for uid, g in policy.groups.items()}
    decision = policy.select_batch(step=step, now=0.0)
    trained = None if decision.train is None else [labels[u] for u in decision.train]
    return trained, [labels[d.uid] for d in decision.drop], [g.prompt_id for g in policy.groups.values()]


# --------------------------------------------------------------- TestBuiltinsImplementInterface
@pytest.mark.parametrize("name", SAMPLERS)
def test_each_sampler_implements_the_policy_protocol(name):
    """Upstream `test_isinstance_protocol`."""
    assert isinstance(make_policy(name, ctx(2, 1)), Policy)


# --------------------------------------------------------------------------- TestAdmission
def test_windowed_never_gates_on_the_trainer_and_never_stamps():
    """Upstream `test_windowed_never_gates_and_never_stamps`: the trainer stays at step 0, yet
    admission goes on as groups finish — only the in-flight cap bounds it."""
    d = ScriptedDriver(make_policy("nemo_windowed", ctx(2, 2), {"max_inflight_prompts": 4, "max_buffered_rollouts": 100}))
    assert len(d.admitted) == 4
    d.finish_all()
    d.finish_all()
    assert len(d.admitted) == 12 and d.step == 0
    assert {a[3] for call in d.trace if call[0] == "admit" for a in call[1]} == {None}


def test_in_order_stamps_a_monotonic_dispatch_index():
    """Upstream `test_in_order_stamps_monotonic_dispatch_index`: dispatch batch i is stamped i."""
    d = ScriptedDriver(make_policy("nemo_in_order", ctx(2), {"max_lookahead_versions": 5}))
    stamps = [a[3] for call in d.trace if call[0] == "admit" for a in call[1]]
    assert stamps == [i // 2 for i in range(12)]


def test_weight_fifo_gate_with_window_zero_admits_one_batch_then_blocks_and_does_not_stamp():
    """Upstream `test_weight_fifo_gates_on_lookahead_and_does_not_stamp`."""
    d = ScriptedDriver(make_policy("nemo_weight_fifo", ctx(2), {"max_staleness_versions": 0}))
    assert len(d.admitted) == 2
    d.finish_all()  # the trainer has not moved: the gate stays shut
    assert len(d.admitted) == 2
    assert {a[3] for call in d.trace if call[0] == "admit" for a in call[1]} == {None}


def test_ready_first_opens_one_more_batch_after_the_trainer_advances():
    """Upstream `test_ready_first_opens_one_more_batch_after_trainer_advances`."""
    d = ScriptedDriver(make_policy("nemo_ready_first", ctx(2), {"max_staleness_versions": 1}))
    assert len(d.admitted) == 4  # the live batch and one lookahead batch
    d.finish_all()
    assert len(d.admitted) == 4
    assert d.train_step() is not None  # version 1
    assert len(d.admitted) == 6


# ------------------------------------------------------------------ TestInOrderEvictMatchesSelect
def test_in_order_keeps_a_slot_whose_target_step_is_now_even_if_its_weight_is_out_of_window():
    """Upstream `test_future_target_not_evicted_even_if_weight_out_of_window`."""
    p = fake_buffer("nemo_in_order", B=1, step=2, slots=[("g", 0, True, 2)], max_lookahead_versions=1)
    assert select(p, 2) == (["g"], [], [])


def test_in_order_evicts_a_ready_slot_whose_target_step_has_passed():
    """Upstream `test_past_target_ready_slot_is_evicted` (unreachable in a run: see the class)."""
    p = fake_buffer("nemo_in_order", B=1, step=3, slots=[("g", 0, True, 1)], max_lookahead_versions=1)
    assert select(p, 3) == (None, ["g"], [])


def test_in_order_never_evicts_a_slot_that_is_still_generating():
    """Upstream `test_unready_slot_is_never_evicted`."""
    p = fake_buffer("nemo_in_order", B=1, step=5, slots=[("g", 0, False, 1)], max_lookahead_versions=1)
    assert select(p, 5) == (None, [], ["g"])


# ----------------------------------------------------------------- TestFactory, TestReadyFirstConfig
@pytest.mark.parametrize(("name", "param", "cls_name"), [
    ("nemo_windowed", "max_staleness_versions", "NemoWindowed"),
    ("nemo_in_order", "max_lookahead_versions", "NemoInOrder"),
    ("nemo_weight_fifo", "max_staleness_versions", "NemoWeightFifo"),
    ("nemo_ready_first", "max_staleness_versions", "NemoReadyFirst"),
])
def test_the_config_name_builds_its_sampler_with_its_window(name, param, cls_name):
    """Upstream `TestFactory` (four tests) and `test_discriminated_union_parses_ready_first`."""
    p = make_policy(name, ctx(2), {param: 3})
    assert type(p).__name__ == cls_name and p.window == 3 and policy_class(name) is type(p)


def test_a_negative_window_is_rejected_naming_the_field():
    """Upstream `test_negative_staleness_is_rejected`."""
    with pytest.raises(ValueError, match=r"^policy.max_staleness_versions=-1: must be >= 0$"):
        make_policy("nemo_ready_first", ctx(2), {"max_staleness_versions": -1})


@pytest.mark.parametrize("name", ["nemo_ready_first", "nemo_weight_fifo", "nemo_in_order"])
def test_gated_samplers_require_a_buffer_for_the_live_and_every_lookahead_batch(name):
    """Upstream `test_required_capacity_covers_live_and_lookahead_batches` and
    `validate_sampler_buffer_capacity`: B=4, window 2 needs 12; 11 is refused in one line."""
    window = "max_lookahead_versions" if name == "nemo_in_order" else "max_staleness_versions"
    assert make_policy(name, ctx(4), {window: 2}).capacity_room() == 12  # the default cap is exactly that
    make_policy(name, ctx(4), {window: 2, "max_buffered_rollouts": 12})
    with pytest.raises(ValueError, match=rf"^policy.max_buffered_rollouts=11: below the {name} sampler's required "
                                         rf"capacity batch_groups·\({window} \+ 1\) = 12; ") as err:
        make_policy(name, ctx(4), {window: 2, "max_buffered_rollouts": 11})
    assert "\n" not in str(err.value)


def test_windowed_has_no_required_buffer_capacity():
    """Upstream: `WindowedSampler.required_buffer_capacity` is None (it evicts instead)."""
    p = make_policy("nemo_windowed", ctx(4), {"max_staleness_versions": 2, "max_buffered_rollouts": 1})
    assert p.capacity_room() == 1


# ----------------------------------------------------------------------------- TestWindowedSelect
def test_windowed_selects_ready_groups_in_the_window():
    """Upstream `test_selects_ready_groups_in_window`; our evict runs first, so c leaves as evicted."""
    p = fake_buffer("nemo_windowed", B=2, step=5, slots=[("a", 3), ("b", 5), ("c", 1)], max_staleness_versions=2)
    assert select(p, 5) == (["a", "b"], ["c"], [])


def test_windowed_below_the_batch_size_waits():
    """Upstream `test_below_min_returns_none`."""
    p = fake_buffer("nemo_windowed", B=2, step=5, slots=[("a", 5)], max_staleness_versions=2)
    assert select(p, 5) == (None, [], ["a"])


def test_windowed_leaves_unready_groups_out():
    """Upstream `test_unready_excluded`."""
    p = fake_buffer("nemo_windowed", B=1, step=5, slots=[("a", 5, False)], max_staleness_versions=2)
    assert select(p, 5) == (None, [], ["a"])


def test_windowed_freshest_first_orders_by_lag():
    """Upstream `test_freshest_first_orders_by_lag`."""
    slots = [("old", 1), ("new", 5)]
    p = fake_buffer("nemo_windowed", B=1, step=5, slots=slots, max_staleness_versions=10, sample_freshest_first=True)
    assert select(p, 5) == (["new"], [], ["old"])
    p = fake_buffer("nemo_windowed", B=1, step=5, slots=slots, max_staleness_versions=10)
    assert select(p, 5) == (["old"], [], ["new"])  # the default: buffer (dispatch) order


def test_windowed_takes_ready_groups_in_dispatch_order_which_decides_what_it_evicts_next():
    """Issue 14's first NeMo difference: "late" was dispatched first and finished last. Upstream
    takes it (buffer order) and keeps "early" in the window; completion order would take "early"
    and evict "late" at the next step."""
    p = fake_buffer("nemo_windowed", B=1, step=5, slots=[("late", 4), ("early", 5)], max_staleness_versions=1)
    assert [g.prompt_id for g in sorted(p.done, key=lambda g: g.finish_seq)] == ["early", "late"]
    assert select(p, 5) == (["late"], [], ["early"])


# -------------------------------------------------------------------------- TestWeightFifoSelect
def test_weight_fifo_drains_the_oldest_in_window_weight_first():
    """Upstream `test_drains_oldest_in_window_weight_first`."""
    p = fake_buffer("nemo_weight_fifo", B=2, step=5, slots=[("old1", 3), ("new", 5), ("old2", 3)],
                    max_staleness_versions=5)
    assert select(p, 5) == (["old1", "old2"], [], ["new"])


def test_weight_fifo_waits_for_a_partial_oldest_batch():
    """Upstream `test_waits_for_partial_oldest_batch`."""
    p = fake_buffer("nemo_weight_fifo", B=2, step=5, slots=[("old", 3)], max_staleness_versions=5)
    assert select(p, 5) == (None, [], ["old"])


def test_weight_fifo_with_an_empty_window_waits():
    """Upstream `test_empty_window_returns_none` (a weight above the trainer: only a fake holds one)."""
    p = fake_buffer("nemo_weight_fifo", B=1, step=5, slots=[("future", 9)], max_staleness_versions=2)
    assert select(p, 5) == (None, [], ["future"])


# -------------------------------------------------------------------------- TestReadyFirstSelect
def test_ready_first_mixes_ready_weight_versions_in_buffer_order():
    """Upstream `test_mixes_ready_weight_versions_in_buffer_order`."""
    p = fake_buffer("nemo_ready_first", B=3, step=3,
                    slots=[("old", 1), ("current", 3), ("middle", 2), ("future", 4)], max_staleness_versions=1)
    assert select(p, 3) == (["old", "current", "middle"], [], ["future"])
    # Beyond upstream's case: a slot above the trainer's version is skipped, not just left last.
    p = fake_buffer("nemo_ready_first", B=1, step=3, slots=[("future", 4), ("old", 1)], max_staleness_versions=1)
    assert select(p, 3) == (["old"], [], ["future"])


def test_ready_first_never_evicts_so_a_late_straggler_stays_selectable():
    """Upstream `test_no_eviction_keeps_late_straggler_selectable`."""
    p = fake_buffer("nemo_ready_first", B=1, step=5, slots=[("late", 0)], max_staleness_versions=1)
    assert select(p, 5) == (["late"], [], [])


# ---------------------------------------------------------------------------- TestInOrderSelect
def test_in_order_matches_the_target_step_ignoring_the_weight_window():
    """Upstream `test_matches_target_step_ignoring_weight_window`."""
    p = fake_buffer("nemo_in_order", B=1, step=5, slots=[("g", 100, True, 5)], max_lookahead_versions=1)
    assert select(p, 5) == (["g"], [], [])


def test_in_order_does_not_select_another_steps_target():
    """Upstream `test_non_matching_target_not_selected`."""
    p = fake_buffer("nemo_in_order", B=1, step=5, slots=[("g", 5, True, 6)], max_lookahead_versions=1)
    assert select(p, 5) == (None, [], ["g"])


# -------------------------------------------------------------------- TestDefaultEvictSkipsUnready
def test_windowed_evicts_ready_groups_below_the_window():
    """Upstream `test_windowed_evict_drops_ready_below_window`."""
    p = fake_buffer("nemo_windowed", B=1, step=5, slots=[("stale", 0), ("fresh", 5)], max_staleness_versions=1)
    assert select(p, 5) == (["fresh"], ["stale"], [])


def test_windowed_evict_skips_an_unready_stale_group():
    """Upstream `test_windowed_evict_skips_unready_stale`."""
    p = fake_buffer("nemo_windowed", B=1, step=5, slots=[("stale_unready", 0, False)], max_staleness_versions=1)
    assert select(p, 5) == (None, [], ["stale_unready"])


# ------------------------------------------------------------------------ TestDispatchCursorRestore
def resumed(name: str, steps: int, **params) -> ScriptedDriver:
    """A driver trained `steps` steps, whose policy is then replaced by one restored from its checkpoint."""
    d = ScriptedDriver(make_policy(name, ctx(2), params))
    for _ in range(steps):
        d.finish_all()
        assert d.train_step() is not None
    fresh = make_policy(name, ctx(2), params)
    fresh.load_state_dict(json.loads(json.dumps(d.policy.state_dict())))
    d.policy = fresh
    return d


def test_a_resumed_in_order_sampler_stamps_from_the_trainer_version():
    """Upstream `test_resumed_in_order_stamps_from_trainer_version` and `test_fresh_start_is_a_noop_seed`."""
    d = resumed("nemo_in_order", 7, max_lookahead_versions=1)
    d.finish_all()
    assert d.train_step() is not None  # step 7 took the batch stamped 7
    stamps = [a[3] for call in d.trace if call[0] == "admit" for a in call[1]]
    assert stamps == [i // 2 for i in range(len(stamps))] and stamps[-1] == 9


def test_a_resumed_gate_admits_its_window_then_blocks():
    """Upstream `test_resumed_gate_admits_window_then_blocks`."""
    d = resumed("nemo_weight_fifo", 7, max_staleness_versions=0)
    before = len(d.admitted)
    d.admit()
    d.finish_all()
    assert len(d.admitted) == before == 2 * 8  # batch 7 dispatched, nothing beyond it


# ------------------------------------------------------------------------ TestInflightAbortPolicy
def test_windowed_aborts_in_flight_groups_only_below_the_weight_window_queued_ones_too():
    """Upstream `test_windowed_aborts_only_below_weight_window`, plus issue 14's fourth NeMo
    difference: the version is tagged at dispatch, so a request still queued in the engine is
    aborted like a running one."""
    p = fake_buffer("nemo_windowed", B=1, step=4,
                    slots=[("run2", 2, False), ("run3", 3, False), ("queued2", 2, False)], max_staleness_versions=2)
    p.groups[2].status, p.groups[2].start_version = GroupState.QUEUED, None
    decision = p.on_version_published(version=5, now=0.0)
    assert sorted(d.uid for d in decision.drop) == [0, 2]
    assert {d.reason for d in decision.drop} == {"nemo_abort_inflight"} and list(p.groups) == [1]


@pytest.mark.parametrize("name", ["nemo_weight_fifo", "nemo_in_order"])
def test_gated_samplers_never_abort_in_flight_groups(name):
    """Upstream `test_gated_samplers_never_abort_inflight`."""
    window = "max_lookahead_versions" if name == "nemo_in_order" else "max_staleness_versions"
    p = fake_buffer(name, B=1, step=4, slots=[("g", 0, False)], **{window: 1})
    assert not p.on_version_published(version=5, now=0.0)


def test_the_fake_buffer_is_a_consistent_checkpoint():
    """The fake is the policy's own state format: it round-trips through `state_dict`."""
    p = fake_buffer("nemo_windowed", B=2, step=5, slots=[("a", 3), ("b", 5, False)], max_staleness_versions=2)
    q = make_policy("nemo_windowed", ctx(2), dataclasses.asdict(p.params))
    q.load_state_dict(p.state_dict())
    assert q.state_dict() == p.state_dict() and q.num_done == 1 and q.inflight == 1
