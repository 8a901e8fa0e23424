"""`ClusterConfig`: the typed `cluster=` group — where generation runs and how the trainer's processes join.

Each mode has its own config dataclass, built from `conf/cluster/<mode>.yaml` by
`planner.configs.build` (which also builds the nested `distributed` section):

- `local` (one process) and `slurm` (one JAX process per SLURM task): `ProcessConfig`, only the
  multi-host JAX settings (`cluster.distributed`, distributed.py);
- `ray`: `RayClusterConfig` (ray/config.py), the generation workers as Ray actors plus `distributed`.

A mode is an entry of CLUSTER_MODES, as an engine backend is one of the engine registry
(engines/registry.py): `ClusterMode.facts` states, once, what the rest of the run needs to know
of a configured mode (`ClusterFacts`: whether its own workers run the engine and how many, the
key that sets them, whether it can move a running request between engine replicas), and the
entry's `connect` and `remote_engine` are what only such a mode does: join the cluster before
the run installs its signal handlers, and build the engine behind its workers. `ClusterConfig`
is what the run reads: the mode's name and its typed keys, and through them the entry. Nothing
else branches on the mode's name or asks its config for a field by name.

To add a mode: its dataclass (with a `distributed` field), a facts function, `connect` and
`remote_engine` when its workers run the engine, an entry under its name in CLUSTER_MODES
(plus the package it needs), and a `conf/cluster/<name>.yaml`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from jaxrl_async.cluster.distributed import DistributedConfig
from jaxrl_async.cluster.ray.config import RayClusterConfig
from planner.configs import build, check


@dataclass(frozen=True)
class ProcessConfig:
    """`cluster=local` and `cluster=slurm`: the trainer's processes, generation in-process.

    Attributes:
      distributed: multi-host JAX for the trainer (`cluster.distributed.*`, distributed.py).
        `local` takes the default (mode auto), so the multiprocess / sbatch / tpu launchers'
        environment (JAXRL_*, SLURM_*, TPU) still applies.
    """

    distributed: DistributedConfig = field(default_factory=DistributedConfig)


@dataclass(frozen=True)
class ClusterFacts:
    """What the run reads of one configured cluster mode (the engine's placement, the start-up
    checks, the summary); stated by the mode's entry so that consumers cannot drift."""

    engine_workers: int | None  # workers the cluster runs the engine in, one replica each; None: in-process
    workers_key: str | None  # the `cluster.` key that sets engine_workers (named in errors)
    migrates: bool  # can move a running request between engine replicas (`policy.migrate`)


# (mode config, engine name, engine config, model source, dtype, on_lost) -> GenerationEngine
RemoteEngine = Callable[[Any, str, dict, str, "str | None", Callable[[list[str]], None]], Any]


def _in_process(config: ProcessConfig) -> ClusterFacts:
    # The trainer's process builds the engine: its replicas (engine.replicas) migrate among
    # themselves (engines/replicated.py).
    return ClusterFacts(engine_workers=None, workers_key=None, migrates=True)


def _nothing_to_join(config: Any) -> None:
    """A mode without workers of its own joins nothing (multi-host JAX joins in the job)."""


@dataclass(frozen=True)
class ClusterMode:
    """One `cluster=` option: the dataclass of its keys, its facts, what only a mode with engine
    workers does, and the optional package it needs."""

    config: type
    facts: Callable[[Any], ClusterFacts] = _in_process  # (config) -> its facts
    connect: Callable[[Any], None] = _nothing_to_join  # (config): join before the signal handlers
    remote_engine: RemoteEngine | None = None  # the engine behind the workers (engine_workers set)
    package: str | None = None  # checked at start-up: a one-line error, not an ImportError mid-run
    install: str = ""  # how to install it


def _ray_facts(config: RayClusterConfig) -> ClusterFacts:
    # The proxy moves no request between workers (cluster/ray/proxy.py: `migrate` left out).
    return ClusterFacts(engine_workers=config.num_workers, workers_key="num_workers", migrates=False)


def _ray_connect(config: RayClusterConfig) -> None:
    from jaxrl_async.cluster.ray.connect import connect

    connect(config)


def _ray_engine(config: RayClusterConfig, engine: str, engine_config: dict, model_source: str,
                dtype: str | None, on_lost: Callable[[list[str]], None]) -> Any:
    from jaxrl_async.cluster.ray.actor import EngineSpec
    from jaxrl_async.cluster.ray.proxy import RayEngineProxy

    return RayEngineProxy(EngineSpec(engine, engine_config, model_source, dtype), config, on_lost=on_lost)


CLUSTER_MODES: dict[str, ClusterMode] = {
    "local": ClusterMode(ProcessConfig),
    "ray": ClusterMode(RayClusterConfig, _ray_facts, _ray_connect, _ray_engine, package="ray",
                       install="pip install -e '.[ray]'"),
    "slurm": ClusterMode(ProcessConfig),
}


def mode_entry(name: Any) -> ClusterMode:
    """The CLUSTER_MODES entry of `cluster.name` (a one-line error naming the modes otherwise)."""
    check(name in CLUSTER_MODES, "cluster.name", name, f"must be one of {tuple(CLUSTER_MODES)} (conf/cluster/*.yaml)")
    return CLUSTER_MODES[name]


@dataclass(frozen=True)
class ClusterConfig:
    """The `cluster=` group as the run reads it: the mode's name and its typed keys."""

    name: str  # one of CLUSTER_MODES
    mode: Any  # CLUSTER_MODES[name].config: the mode's keys, typed

    def __post_init__(self) -> None:
        expected = mode_entry(self.name).config
        check(isinstance(self.mode, expected), f"cluster={self.name} config", type(self.mode).__name__,
              f"must be a {expected.__name__}")

    @property
    def entry(self) -> ClusterMode:
        return mode_entry(self.name)

    @property
    def facts(self) -> ClusterFacts:
        return self.entry.facts(self.mode)

    @property
    def distributed(self) -> DistributedConfig:
        """Multi-host JAX for the trainer: every mode has it (`cluster.distributed.*`)."""
        return self.mode.distributed

    def connect(self) -> None:
        """Join the cluster that hosts the engine workers (nothing to join without one)."""
        self.entry.connect(self.mode)

    def remote_engine(self, engine: str, engine_config: dict, model_source: str, dtype: str | None,
                      on_lost: Callable[[list[str]], None]) -> Any:
        """The engine behind the cluster's workers (cluster=ray: `RayEngineProxy`), whose lost
        requests go to `on_lost(request_ids)`; only when `facts.engine_workers` is not None."""
        build_remote = self.entry.remote_engine
        check(build_remote is not None, "cluster.name", self.name, "runs no engine workers (cluster=ray does)")
        return build_remote(self.mode, engine, engine_config, model_source, dtype, on_lost)


def cluster_config(values: Mapping[str, Any]) -> ClusterConfig:
    """`{"name": <mode>, **its keys}` (a composed `conf/cluster/*.yaml`) -> `ClusterConfig`."""
    values = dict(values)
    name = values.pop("name", None)
    return ClusterConfig(name, build(mode_entry(name).config, values, "cluster", what=f"key for cluster={name}"))
