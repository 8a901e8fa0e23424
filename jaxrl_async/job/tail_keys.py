"""The tail's keys as this run is configured: which are on, and which cannot act here.

`engine.speculation.when` and `policy.migrate` (docs/design.md §2.14) act only where the engine,
the cluster and the load let them, and a key that cannot act would otherwise do nothing in
silence. `tail_keys` says which are on — the progress line and the final report show their
counts then (runtime/metrics.py `tail_counts`) — and `inert_keys` gives one start-up warning
line per key that cannot take effect in this configuration:

- `policy.migrate=true` with one engine replica (nowhere to move a straggler to), or with an
  engine that does not migrate;
- `engine.speculation.when=critical` with an engine that ignores the planner's critical marks
  (vLLM refuses the key already when its config is typed: engines/vllm/convert.py);
- `engine.speculation.when=always` with `max_active` below the engine's slots: speculation runs
  only while at most `max_active` sequences are active, so a full engine decodes without it.

Whether an engine migrates or honours critical marks is read from the engine the run built: the
contract's `migrate` and `mark_critical` are no-ops (engines/base.py), so an engine that keeps
them (one JAX engine, a cluster's proxy that does not forward them) does nothing with the
decision, and one that overrides them acts on it. No backend or cluster is named here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from jaxrl_async.engines.base import GenerationEngine
from jaxrl_async.engines.speculation import SpeculationConfig
from jaxrl_async.job.setup import TrainSetup
from planner.registry import make_policy
from planner.types import PlanContext


@dataclass(frozen=True)
class TailKeys:
    """The tail's features this run turns on."""

    speculation: SpeculationConfig | None  # the engine's `engine.speculation.*` when `when` is not never
    migrate: bool  # `policy.migrate`: the policy asks the driver to move its stragglers


def policy_params(setup: TrainSetup) -> Any:
    """The policy's typed native parameters (`policy.*`): the policy built once more from the setup."""
    run = setup.run
    ctx = PlanContext(run.batch_groups, run.group_size, run.max_staleness, run.steps)
    return make_policy(setup.policy_name, ctx, setup.policy_overrides).params


def tail_keys(setup: TrainSetup) -> TailKeys:
    spec = setup.engine_facts.speculation
    # `migrate` is a native parameter of the policies that migrate (lookahead); the others have none.
    migrate = bool(getattr(policy_params(setup), "migrate", False))
    return TailKeys(spec if spec is not None and spec.enabled else None, migrate)


def _acts_on(engine: GenerationEngine, call: str) -> bool:
    """Whether `engine` implements the contract's no-op `call` (engines/base.py)."""
    return getattr(type(engine), call) is not getattr(GenerationEngine, call)


def inert_keys(setup: TrainSetup, engine: GenerationEngine) -> list[str]:
    """One line per tail key that cannot take effect with `engine` (the run's, as built) in `setup`."""
    keys, facts, lines = tail_keys(setup), setup.engine_facts, []
    where = f"{type(engine).__name__} (engine={setup.engine_name}, cluster={setup.cluster.name})"
    if keys.migrate and setup.engine_workers < 2:
        lines.append(f"policy.migrate=true has no effect: the run has {setup.engine_workers} engine replica, so no "
                     "straggler can move (engine.replicas=2 and engine.colocate=false, or cluster.num_workers=2 "
                     "with cluster=ray)")
    elif keys.migrate and not _acts_on(engine, "migrate"):
        lines.append(f"policy.migrate=true has no effect: {where} does not migrate requests")
    spec = keys.speculation
    if spec is not None and spec.when == "critical" and not _acts_on(engine, "mark_critical"):
        lines.append(f"engine.speculation.when=critical has no effect: {where} ignores the planner's critical marks")
    if spec is not None and spec.when == "always" and spec.max_active < facts.slots:
        lines.append(f"engine.speculation.when=always: speculation runs only while <= engine.speculation.max_active="
                     f"{spec.max_active} sequences are active, and engine.{facts.slots_key}={facts.slots} decodes up "
                     f"to {facts.slots} at once")
    return lines
