"""Contract tests every baseline policy must pass: registration, native parameters, checkpoints,
progress. The reference's worked examples are in `test_reference_examples.py`."""

from __future__ import annotations

import dataclasses
import json
import random
import re

import pytest

from planner.base import Policy
from planner.registry import NOT_GIVEN, POLICIES, given_params, make_policy, policy_class
from planner.types import PlanContext
from tests.helpers.scripted import ScriptedDriver, random_run

STRICT = {"verl_drop", "trl", "roll", "prime_rl", "nemo_windowed", "nemo_weight_fifo", "nemo_in_order",
          "torchtitan_windowed_fifo", "tinker_paced"}
BASELINES = sorted(STRICT | {"verl_wait", "areal", "skyrl", "openrlhf", "slime", "dressage", "nemo_ready_first"})


def ctx(B=2, n=2, eta=2, steps=12):
    return PlanContext(batch_groups=B, group_size=n, max_staleness=eta, total_steps=steps)


def test_all_sixteen_baselines_are_registered_with_the_references_strict_column():
    for name in BASELINES:
        cls = policy_class(name)
        assert cls.name == name
        assert cls.strict == (name in STRICT), name
        assert isinstance(make_policy(name, ctx()), Policy)
    assert len(BASELINES) == 16 and set(POLICIES) == {*BASELINES, "lookahead"}


@pytest.mark.parametrize("name", BASELINES)
def test_build_rejects_an_unknown_native_parameter_with_a_one_line_error(name):
    with pytest.raises(ValueError, match=rf"policy.not_a_param: unknown parameter of policy '{name}'") as err:
        make_policy(name, ctx(), {"not_a_param": 1})
    assert "\n" not in str(err.value)


def test_each_native_parameter_takes_its_value_from_overrides():
    p = make_policy("verl_drop", ctx(eta=5), {"num_warmup_batches": 1}).params
    assert (p.max_off_policy_threshold, p.num_warmup_batches) == (5, 1)


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("verl_drop", {"max_off_policy_threshold": 3, "num_warmup_batches": 3}),
        ("verl_wait", {"max_off_policy_threshold": 3, "num_warmup_batches": 3}),
        ("trl", {"max_staleness": 3, "max_inflight_tasks": None}),
        ("areal", {"max_head_offpolicyness": 3}),
        ("skyrl", {"max_staleness_steps": 3}),
        ("openrlhf", {"async_queue_size": 3}),
        ("slime", {"fully_async_group_prefetch_factor": 4.0}),
        ("roll", {"async_generation_ratio": 3.0}),
        ("prime_rl", {"max_off_policy_steps": 3}),
        ("dressage", {"dressage_staleness_keep_versions": 4, "max_partial_rollout_preempts": 3}),
        ("nemo_windowed", {"max_staleness_versions": 3}),
        ("nemo_weight_fifo", {"max_staleness_versions": 3}),
        ("nemo_ready_first", {"max_staleness_versions": 3}),
        ("nemo_in_order", {"max_lookahead_versions": 3}),
        ("torchtitan_windowed_fifo", {"target_offpolicy_steps": 3, "window_fraction": 0.3}),
        ("tinker_paced", {"max_steps_off_policy": 3, "pipeline_depth": None}),
    ],
)
def test_max_staleness_maps_onto_the_documented_native_parameters(name, expected):
    params = dataclasses.asdict(make_policy(name, ctx(eta=3)).params)
    assert {k: params[k] for k in expected} == expected


def test_unbounded_max_staleness_keeps_the_frameworks_own_defaults():
    for name in BASELINES:
        cls = policy_class(name)
        assert make_policy(name, ctx(eta=None)).params == cls.Params()


@pytest.mark.parametrize(
    ("name", "bad", "message"),
    [
        ("verl_drop", {"max_off_policy_threshold": 0}, "policy.max_off_policy_threshold=0: must be >= 1"),
        ("roll", {"async_generation_ratio": -1.0}, "policy.async_generation_ratio=-1.0: must be >= 0"),
        ("prime_rl", {"min_inflight": 8, "max_inflight": 4}, "policy.min_inflight=8: must be <= max_inflight=4"),
        ("trl", {"max_inflight_tasks": 1}, "policy.max_inflight_tasks=1: below group_size=2"),
        ("nemo_in_order", {"max_lookahead_versions": -1}, "policy.max_lookahead_versions=-1: must be >= 0"),
        ("nemo_in_order", {"max_buffered_rollouts": 5}, "policy.max_buffered_rollouts=5: below the nemo_in_order "
         "sampler's required capacity batch_groups·(max_lookahead_versions + 1) = 6"),
        ("torchtitan_windowed_fifo", {"window_fraction": 0.0}, "policy.window_fraction=0.0: must be null (strict "
         "FIFO) or in (0, 1]"),
        ("torchtitan_windowed_fifo", {"target_offpolicy_steps": -1}, "policy.target_offpolicy_steps=-1: must be >= 0"),
        ("tinker_paced", {"max_steps_off_policy": 1, "pipeline_depth": 2}, "policy.pipeline_depth=2: must be null "
         "or in [0, max_steps_off_policy=1]"),
    ],
)
def test_invalid_native_parameters_fail_at_build_naming_field_and_value(name, bad, message):
    with pytest.raises(ValueError, match=re.escape(message)) as err:
        make_policy(name, ctx(), bad)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("name", BASELINES)
def test_a_checkpoint_restored_into_a_new_object_continues_identically(name):
    def run(swap_at):
        policy = make_policy(name, ctx(B=2, n=2, eta=1, steps=10))
        d = ScriptedDriver(policy, autostart=False, partial=True)
        rng = random.Random(7)
        random_run(d, rng, 4)
        if swap_at:
            state = json.loads(json.dumps(d.policy.state_dict()))
            fresh = make_policy(name, ctx(B=2, n=2, eta=1, steps=10))
            fresh.load_state_dict(state)
            assert fresh.state_dict() == state
            d.policy = fresh
        random_run(d, rng, 10)
        return d.trace, d.policy.state_dict()

    assert run(swap_at=False) == run(swap_at=True)


def test_loading_another_policys_checkpoint_is_refused():
    state = make_policy("roll", ctx()).state_dict()
    with pytest.raises(ValueError, match="checkpoint holds policy 'roll', this run uses 'trl'"):
        make_policy("trl", ctx()).load_state_dict(state)


@pytest.mark.parametrize("name", BASELINES)
@pytest.mark.parametrize("partial", [False, True])
def test_every_baseline_makes_progress_and_accounts_for_every_admitted_group(name, partial):
    for seed in range(3):
        d = ScriptedDriver(make_policy(name, ctx(B=3, n=2, eta=1, steps=10)), autostart=False, partial=partial)
        random_run(d, random.Random(seed), 10)
        assert len(d.batches) == 10
        assert len(d.admitted) == len(d.trained) + len(d.dropped) + d.untrained()
        leftover = d.policy.finish(now=0.0)
        assert {x.reason for x in leftover.drop} <= {"end_of_run"}
        assert len(leftover.drop) == d.untrained()
        assert d.policy.groups == {}


def test_skyrl_counts_groups_trained_past_max_staleness_steps_without_dropping_them():
    d = ScriptedDriver(make_policy("skyrl", ctx(B=1, eta=1)))
    slow = d.admitted[0]
    for _ in range(3):
        d.finish_all([u for u in d.running if u != slow])
        d.train_step()
    d.finish(slow)
    while slow not in {t.uid for t in d.trained}:
        d.finish_all()
        d.train_step()
    assert d.policy.stale_warnings >= 1 and not d.dropped


def test_openrlhf_returns_a_permit_when_the_trainer_takes_a_batch_not_when_the_step_ends():
    p = make_policy("openrlhf", ctx(B=2, eta=2))
    d = ScriptedDriver(p)
    assert len(d.admitted) == 4  # two batch permits
    d.finish_all()
    assert p.admission_quota(0.0) == 0
    p.select_batch(step=0, now=0.0)
    assert p.admission_quota(0.0) == 2


def test_slime_checks_running_and_queued_prompts_separately_against_the_threshold():
    p = make_policy("slime", ctx(B=2, n=2, eta=1))  # P = 4
    d = ScriptedDriver(p)
    assert len(d.running) == 4
    d.finish_all(d.admitted[:3])
    assert len(d.running) == 4 and len(d.done) == 3  # 3 + 4 > 4: not their sum
    d.finish(d.admitted[3])
    assert len(d.done) == 4 and len(d.running) == 3  # queue full: admission pauses


def test_trl_defaults_to_per_step_trajectories_times_max_staleness_in_flight():
    d = ScriptedDriver(make_policy("trl", ctx(B=4, n=8, eta=3)))
    assert len(d.running) == 4 * 3  # 96 trajectories of 8
    d = ScriptedDriver(make_policy("trl", ctx(B=4, n=8, eta=0)))
    assert len(d.running) == 4  # max(max_staleness, 1)


def test_trl_drops_groups_whose_model_version_is_too_old_and_pulls_the_next():
    d = ScriptedDriver(make_policy("trl", ctx(B=1, n=1, eta=1), {"max_inflight_tasks": 4}))
    slow = d.admitted[0]
    for _ in range(2):
        d.finish(max(d.running))
        d.train_step()
    d.finish(slow)
    d.finish(max(d.running))
    assert d.train_step() is not None
    assert d.dropped[slow] == "trl_max_staleness" and d.max_staleness <= 1


def test_each_policy_config_file_lists_exactly_the_native_parameters_of_its_policy():
    import yaml

    from tests.helpers import CONF

    conf = CONF / "policy"
    for name in [*BASELINES, "lookahead"]:
        data = yaml.safe_load((conf / f"{name}.yaml").read_text())
        assert data.pop("name") == name
        assert set(data) == {f.name for f in dataclasses.fields(policy_class(name).Params)}, name
        assert all(v == NOT_GIVEN for v in data.values()), name  # every parameter left to the policy
        make_policy(name, ctx(), given_params(data))
