"""planner.registry: names to policies, and which native parameters a config gives."""

import pytest

from planner.registry import NOT_GIVEN, given_params, make_policy
from planner.types import PlanContext

CTX = PlanContext(batch_groups=4, group_size=2, max_staleness=2, total_steps=10)


def test_only_parameters_left_not_given_are_dropped_and_an_explicit_null_stays():
    params = {"a": NOT_GIVEN, "b": None, "c": 0.5, "d": 0, "e": "history"}
    assert given_params(params) == {"b": None, "c": 0.5, "d": 0, "e": "history"}


def test_a_parameter_not_given_takes_the_default_and_an_explicit_null_is_its_own_value():
    """torchtitan: `window_fraction` defaults to upstream's 0.3 (W = ⌊0.3·(S+1)·P⌋ = 3 here),
    null is strict FIFO (W = 1); dressage: the keep-versions filter defaults to η + 1, null is off."""
    default = make_policy("torchtitan_windowed_fifo", CTX, given_params({"window_fraction": NOT_GIVEN}))
    strict = make_policy("torchtitan_windowed_fifo", CTX, given_params({"window_fraction": None}))
    assert (default.params.window_fraction, default.window_size, default.staleness_bound()) == (0.3, 3, 3)
    assert (strict.params.window_fraction, strict.window_size, strict.staleness_bound()) == (None, 1, 2)
    keep = "dressage_staleness_keep_versions"
    assert getattr(make_policy("dressage", CTX, {}).params, keep) == 3
    assert getattr(make_policy("dressage", CTX, {keep: None}).params, keep) is None


def test_an_explicit_null_for_a_parameter_that_takes_none_is_a_one_line_error_naming_the_key():
    with pytest.raises(ValueError, match=r"^policy\.target_offpolicy_steps=null: must be an integer "
                                         r"\(leave it \?\?\? for its default\)$"):
        make_policy("torchtitan_windowed_fifo", CTX, {"target_offpolicy_steps": None})
