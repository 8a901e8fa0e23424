"""Name -> policy class. Config validation checks names against this dict itself, so a name cannot drift from the registry."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from planner import configs
from planner.base import PolicyBase

# A native parameter that a config leaves to the policy: OmegaConf's "no value yet". conf/policy/*.yaml
# lists every parameter with it, so that `policy.X=...` can override any of them, while an explicit
# `policy.X=null` stays a value (docs/baselines.md: torchtitan's `window_fraction: null` = strict FIFO).
NOT_GIVEN = configs.MISSING

POLICIES: dict[str, type[PolicyBase]] = {}


def register(cls: type[PolicyBase]) -> type[PolicyBase]:
    """Class decorator; a second class under the same name is a bug, so it raises."""
    if not cls.name:
        raise ValueError(f"{cls.__qualname__} has no `name`")
    if cls.name in POLICIES:
        raise ValueError(f"policy '{cls.name}' registered twice ({POLICIES[cls.name].__qualname__}, {cls.__qualname__})")
    POLICIES[cls.name] = cls
    return cls


def policy_class(name: str) -> type[PolicyBase]:
    import planner.policies  # noqa: F401  (registers every policy)

    try:
        return POLICIES[name]
    except KeyError:
        raise ValueError(f"policy={name}: unknown policy (known: {', '.join(sorted(POLICIES))})") from None


def given_params(params: Mapping[str, Any]) -> dict[str, Any]:
    """The native parameters a composed `policy` mapping (its `name` removed) sets: every key but
    those left `???` (NOT_GIVEN), which the policy fills with its defaults, derived from
    max_staleness where it says so (`PolicyBase.build`). The one rule both entry points apply
    (`planner.simulate`, `jaxrl_async.train`)."""
    return configs.given(params)


def make_policy(name: str, ctx, overrides=None) -> PolicyBase:
    return policy_class(name).build(ctx, overrides)
