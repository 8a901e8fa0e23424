"""`ClusterConfig`: the typed `cluster=` group — where generation runs and how the trainer's processes join.

Each mode has its own config dataclass, built from `conf/cluster/<mode>.yaml` by
`planner.configs.build` (which also builds the nested `distributed` section):

- `local` (one process) and `slurm` (one JAX process per SLURM task): `ProcessConfig`, only the
  multi-host JAX settings (`cluster.distributed`, distributed.py);
- `ray`: `RayClusterConfig` (ray.py), the generation workers as Ray actors plus `distributed`.

`ClusterConfig` is what the run reads: the mode's name, its `DistributedConfig`, the
`RayClusterConfig` when the mode is `ray`, and what differs between the modes, stated here once:
`engine_workers` (the cluster runs the engine in its own workers, one replica each, or the
trainer's process builds it), `connect()` (join the cluster before the run installs its signal
handlers) and `remote_engine(...)` (the engine behind the workers). Nothing else branches on the
mode's name. To add a mode: its dataclass (with a `distributed` field) under its name in
CLUSTER_MODES (`ClusterMode`: plus the package it needs) and a `conf/cluster/<name>.yaml`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from jaxrl_async.cluster.distributed import DistributedConfig
from jaxrl_async.cluster.ray import RayClusterConfig
from planner.configs import build, check


@dataclass(frozen=True)
class ProcessConfig:
    """`cluster=local` and `cluster=slurm`: the trainer's processes, generation in-process.

    Attributes:
      distributed: Multi-host JAX for the trainer. `local` takes the default (mode auto), so the
        multiprocess / sbatch / tpu launchers' environment (JAXRL_*, SLURM_*, TPU) still applies.
    """

    distributed: DistributedConfig = field(default_factory=DistributedConfig)


@dataclass(frozen=True)
class ClusterMode:
    """One `cluster=` option: the dataclass of its keys and the optional package it needs.

    Attributes:
      config: the dataclass of the option's keys (`cluster.*`).
      package: checked at start-up: a one-line error, not an ImportError mid-run
      install: how to install it
    """

    config: type
    package: str | None = None
    install: str = ""


CLUSTER_MODES: dict[str, ClusterMode] = {
    "local": ClusterMode(ProcessConfig),
    "ray": ClusterMode(RayClusterConfig, package="ray", install="pip install -e '.[ray]'"),
    "slurm": ClusterMode(ProcessConfig),
}


@dataclass(frozen=True)
class ClusterConfig:
    """The `cluster=` group as the run reads it.

    Attributes:
      name: one of CLUSTER_MODES
      distributed: multi-host JAX for the trainer (`cluster.distributed.*`).
      ray: cluster=ray only: the generation workers
    """

    name: str
    distributed: DistributedConfig
    ray: RayClusterConfig | None = None

    @property
    def engine_workers(self) -> int | None:
        """The workers the cluster runs the generation engine in, one replica each (cluster=ray:
        `cluster.num_workers`); None: the trainer's process builds and places the engine."""
        return None if self.ray is None else self.ray.num_workers

    def connect(self) -> None:
        """Join the cluster that hosts the engine workers (nothing to join without one)."""
        if self.ray is not None:
            from jaxrl_async.cluster.ray import connect

            connect(self.ray)

    def remote_engine(self, engine: str, engine_config: dict, model_source: str, dtype: str | None,
                      on_lost: Callable[[list[str]], None]) -> Any:
        """The engine behind the cluster's workers (`RayEngineProxy`), whose lost requests go to
        `on_lost(request_ids)`; only when `engine_workers` is not None."""
        from jaxrl_async.cluster.ray import EngineSpec, RayEngineProxy

        check(self.ray is not None, "cluster.name", self.name, "runs no engine workers (cluster=ray does)")
        return RayEngineProxy(EngineSpec(engine, engine_config, model_source, dtype), self.ray, on_lost=on_lost)


def cluster_config(values: Mapping[str, Any]) -> ClusterConfig:
    """`{"name": <mode>, **its keys}` (a composed `conf/cluster/*.yaml`) -> `ClusterConfig`."""
    values = dict(values)
    name = values.pop("name", None)
    check(name in CLUSTER_MODES, "cluster.name", name, f"must be one of {tuple(CLUSTER_MODES)} (conf/cluster/*.yaml)")
    mode = build(CLUSTER_MODES[name].config, values, "cluster", what=f"key for cluster={name}")
    return ClusterConfig(name, mode.distributed, mode if isinstance(mode, RayClusterConfig) else None)
