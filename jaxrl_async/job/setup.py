"""`TrainSetup`: a training run's whole configuration, typed and validated once (`typed_config`).

Hydra composes `conf/train.yaml` (groups: model, task, policy, engine, trainer, cluster; the top
level keys are `RunConfig`'s); `typed_config` turns the composed tree into typed, frozen records,
and every problem is a one-line ValueError naming the dotted key the user typed. Choosing
`engine=NAME` chooses the backend's config class (each carries its `name`), and what the run
needs of a backend or of a cluster mode is what their registries state (engines/registry.py
`EngineFacts`, cluster/config.py `ClusterFacts`): nothing here branches on either name.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig, OmegaConf

from jaxrl_async.cluster.config import ClusterConfig, cluster_config
from jaxrl_async.engines.registry import AnyEngineConfig, EngineEntry, EngineFacts, engine_config, entry_of
from jaxrl_async.models.config import ModelSpec
from jaxrl_async.runtime.config import RunConfig
from jaxrl_async.tasks import task_config
from jaxrl_async.trainer.config import TrainerConfig
from planner.configs import build
from planner.registry import given_params, make_policy
from planner.types import PlanContext

GROUPS = ("model", "task", "policy", "engine", "trainer", "cluster")


@dataclass(frozen=True)
class TrainSetup:
    """Everything a run needs, typed and validated; built once by `typed_config`."""

    run: RunConfig  # the top-level keys
    model: ModelSpec  # model.source (a registered name, a HF directory or a .gguf file), model.dtype
    task: dict[str, Any]  # the `task=` group as composed (typed by `tasks.task_config` here)
    policy_name: str  # a name in planner/registry.py
    policy_overrides: dict[str, Any]  # the native parameters given (planner.registry.given_params)
    engine: AnyEngineConfig  # the chosen backend's config (its class carries `engine.name`)
    trainer: TrainerConfig
    cluster: ClusterConfig

    @property
    def engine_name(self) -> str:
        return self.engine.name

    @property
    def engine_entry(self) -> EngineEntry:
        return entry_of(self.engine)

    @property
    def engine_facts(self) -> EngineFacts:
        """The backend's facts for this run (sync mode "pinned" with LoRA and several resident
        adapter versions: `EngineFacts.with_lora`)."""
        return self.engine_entry.facts(self.engine).with_lora(self.trainer.lora.enabled)

    def start_warnings(self) -> list[str]:
        """One line for each key that cannot act as asked (TrainJob logs them once, at start-up).

        engine.adapter_versions: it cannot act without LoRA (every push is full weights); pushes
        may wait when K < max_staleness + 1 (a group admitted max_staleness versions ago can still
        be sampling, so all K versions may be pinned when the next one arrives); policy.migrate
        cannot act with it (a pinned request stays where its version is resident)."""
        k, lora = self.engine_facts.adapter_versions, self.trainer.lora.enabled
        if k == 1:
            return []
        if not lora:
            return [f"engine.adapter_versions={k} cannot act without LoRA (trainer.lora.rank=0): every push is "
                    "full weights, taken as engine.sync_mode says"]
        out = []
        eta = self.run.max_staleness
        if k < eta + 1:
            out.append(f"engine.adapter_versions={k} < max_staleness+1={eta + 1}: a push may find every resident "
                       "version pinned and wait for a slot to free (summary.json adapter_versions.pushes_waited)")
        if self.policy_overrides.get("migrate"):
            out.append(f"policy.migrate=true cannot act with engine.adapter_versions={k}: a pinned request "
                       "finishes on its replica (another need not hold its version)")
        return out

    @property
    def engine_in_process(self) -> bool:
        """The trainer's process builds (and, unless it places itself, places) the engine;
        False: the cluster's workers run it."""
        return self.cluster.facts.engine_workers is None

    @property
    def engine_workers(self) -> int:
        """Engines the run feeds: the cluster's workers, or the replicas built in-process."""
        workers = self.cluster.facts.engine_workers
        return self.engine_facts.replicas if workers is None else workers


def typed_config(cfg: DictConfig | Mapping[str, Any]) -> TrainSetup:
    """The composed config -> `TrainSetup`; every problem is a one-line ValueError."""
    plain = OmegaConf.to_container(cfg, resolve=True) if isinstance(cfg, DictConfig) else dict(cfg)
    plain.pop("hydra", None)
    missing = [g for g in GROUPS if not isinstance(plain.get(g), dict)]
    if missing:
        raise ValueError(f"{missing[0]}: config group missing (choose one with {missing[0]}=NAME)")
    groups = {g: dict(plain.pop(g)) for g in GROUPS}
    run = build(RunConfig, plain, "")
    cluster = cluster_config(groups["cluster"])
    model = build(ModelSpec, groups["model"], "model")
    task_config(groups["task"])  # typed here, with the other sections; its data is read by job/preflight.py
    policy = groups["policy"]
    name = policy.pop("name", None)
    if not isinstance(name, str):
        raise ValueError(f"policy.name={name!r}: every conf/policy/*.yaml names its policy")
    overrides = given_params(policy)  # ??? in conf/policy: not given (the default); null is a value
    # Built once here so that an unknown policy or a bad native parameter fails at start-up.
    policy_object = make_policy(name, PlanContext(run.batch_groups, run.group_size, run.max_staleness, run.steps),
                                overrides)
    engine_values = groups["engine"]
    engine = engine_config(engine_values.pop("name", "jax"), engine_values)
    entry, facts = entry_of(engine), entry_of(engine).facts(engine)
    if entry.package is not None:
        _require_package(entry.package, f"engine={engine.name}", entry.install)
    mode, where = cluster.entry, cluster.facts
    if mode.package is not None:
        _require_package(mode.package, f"cluster={cluster.name}", mode.install)
    if where.engine_workers is not None and facts.replicas != 1:
        raise ValueError(f"engine.replicas={facts.replicas}: with cluster={cluster.name} every worker is one "
                         f"replica; set cluster.{where.workers_key} instead")
    # Read from the typed parameters (a policy without the parameter never asks to migrate).
    if getattr(policy_object.params, "migrate", False) and not where.migrates:
        raise ValueError(f"policy.migrate=true: cluster={cluster.name} cannot move a running request between "
                         "its engine workers; set policy.migrate=false (or run the replicas in-process: "
                         "cluster=local engine.replicas=2)")
    if facts.slots < run.group_size:
        raise ValueError(f"engine.{facts.slots_key}={facts.slots}: must be >= group_size={run.group_size} "
                         "(a group's samples are decoded together)")
    trainer = build(TrainerConfig, groups["trainer"], "trainer")
    if model.adapter is not None and where.engine_workers is not None:
        raise ValueError(f"model.adapter={model.adapter!r}: cluster={cluster.name}'s workers load model.source "
                         "alone; merging an adapter there is not built yet")
    engine = _with_adapters(engine, entry, trainer.lora.rank, run.max_staleness, cluster)
    return TrainSetup(run, model, groups["task"], name, overrides, engine, trainer, cluster)


def _with_adapters(engine: Any, entry: EngineEntry, rank: int, max_staleness: int | None,
                   cluster: ClusterConfig) -> Any:
    """The engine config for `trainer.lora.rank` (0: no LoRA): an engine with `serve_adapters`
    serves the adapters itself, sized for the versions in-flight requests may be pinned to
    (max_staleness + 1, and never more than the sequences it decodes at once); an in-process JAX
    engine merges each pushed adapter as it is."""
    if rank and cluster.facts.engine_workers is not None:
        # The workers' engines are built from model.source and the engine keys on their own nodes;
        # replacing a lost one on the base and bringing it to the newest adapter is not written or tested.
        raise ValueError(f"trainer.lora.rank={rank}: LoRA with cluster={cluster.name} is not built yet (its "
                         "workers' engines are not built for adapters); set trainer.lora.rank=0 or cluster=local")
    facts = entry.facts(engine)
    if entry.serve_adapters is None:
        if rank and facts.places_itself:
            raise ValueError(f"trainer.lora.rank={rank}: engine={engine.name} cannot serve LoRA adapters; "
                             "set trainer.lora.rank=0 or use engine=jax or engine=vllm")
        return engine
    versions = facts.slots if max_staleness is None else min(max_staleness + 1, facts.slots)
    return entry.serve_adapters(engine, rank, versions)


def _require_package(module: str, what: str, fix: str) -> None:
    """A missing optional backend is a one-line error at start-up, not an ImportError mid-run."""
    if importlib.util.find_spec(module) is None:
        raise ValueError(f"{what}: the {module!r} package is not installed in {sys.executable} ({fix})")
