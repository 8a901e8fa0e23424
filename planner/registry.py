"""Name -> policy class. Config validation checks names against this dict itself, so a name cannot drift from the registry."""

from __future__ import annotations

from planner.base import PolicyBase

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


def make_policy(name: str, ctx, overrides=None) -> PolicyBase:
    return policy_class(name).build(ctx, overrides)
