"""planner/base.py: `PolicyBase.build` types every policy's native parameters through the one
builder (`planner.configs.build`), as every other config section is typed."""

from __future__ import annotations

import dataclasses

import pytest

import planner.policies  # noqa: F401  (registers every policy)
from planner.registry import NOT_GIVEN, POLICIES, make_policy, policy_class
from planner.types import PlanContext
from tests.helpers.docstrings import undocumented_fields

CTX = PlanContext(batch_groups=4, group_size=2, max_staleness=2, total_steps=10)
PARAMS = sorted((name, f.name) for name in POLICIES for f in dataclasses.fields(policy_class(name).Params))


def test_every_policy_has_parameters_to_type():
    assert len({name for name, _ in PARAMS}) == len(POLICIES) == 17


@pytest.mark.parametrize(("text", "message"), [
    ("no", "policy.migrate='no': must be true or false"),
    ("yes", "policy.migrate='yes': must be true or false"),
    (0, "policy.migrate=0: must be true or false"),
])
def test_text_or_a_number_for_a_boolean_parameter_is_refused_naming_the_key(text, message):
    """`policy.migrate=no` used to turn migration on: any non-empty text is truthy."""
    with pytest.raises(ValueError) as info:
        make_policy("lookahead", CTX, {"migrate": text})
    assert str(info.value) == message


@pytest.mark.parametrize(("name", "key"), PARAMS)
def test_every_native_parameter_refuses_a_value_of_the_wrong_type_naming_the_key(name, key):
    with pytest.raises(ValueError) as info:
        make_policy(name, CTX, {key: ["x"]})  # a list fits no parameter's type
    assert str(info.value).startswith(f"policy.{key}=['x']: must be ") and "\n" not in str(info.value)


def test_a_number_parameter_takes_an_integer_and_text_names_the_key():
    assert make_policy("roll", CTX, {"async_generation_ratio": 1}).params.async_generation_ratio == 1
    with pytest.raises(ValueError, match=r"^policy\.async_generation_ratio='1': must be a number$"):
        make_policy("roll", CTX, {"async_generation_ratio": "1"})
    with pytest.raises(ValueError, match=r"^policy\.max_staleness_versions=1\.5: must be an integer$"):
        make_policy("nemo_windowed", CTX, {"max_staleness_versions": 1.5})


def test_a_parameter_left_not_given_keeps_the_default_derived_from_max_staleness():
    """`???` is "not given" here too, so it cannot hide the derived default behind the class's own."""
    assert make_policy("areal", CTX, {"max_head_offpolicyness": NOT_GIVEN}).params.max_head_offpolicyness == 2
    assert make_policy("areal", CTX, {}).params.max_head_offpolicyness == 2


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_every_policys_parameters_are_documented_in_the_attributes_section(name):
    assert undocumented_fields(policy_class(name).Params) == []


def test_a_checkpoint_restores_the_typed_parameters():
    policy = make_policy("lookahead", CTX, {"migrate": True, "tail_fraction": 0.5})
    fresh = make_policy("lookahead", CTX)
    fresh.load_state_dict(policy.state_dict())
    assert fresh.params == policy.params


def test_a_checkpoint_whose_parameters_do_not_type_is_refused_naming_the_key():
    state = make_policy("lookahead", CTX).state_dict()
    state["params"]["migrate"] = "no"
    with pytest.raises(ValueError, match=r"^policy\.migrate='no': must be true or false$"):
        make_policy("lookahead", CTX).load_state_dict(state)


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_a_policy_made_without_parameters_gets_the_ones_build_derives(name):
    assert policy_class(name)(CTX).params == make_policy(name, CTX).params
