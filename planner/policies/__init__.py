"""Every staleness policy, registered by name on import (docs/design.md §3).

Baselines, one module per framework, built from `planner.policies.blocks`; `lookahead` is ours
(docs/design.md §2). How to add one: write a module with a `@register`ed `PolicyBase` subclass and import
it here.
"""

from planner.policies import (  # noqa: F401
    areal,
    dressage,
    nemo,
    openrlhf,
    prime_rl,
    roll,
    skyrl,
    slime,
    tinker,
    torchtitan,
    trl,
    verl,
)

from planner.policies import lookahead  # noqa: F401
