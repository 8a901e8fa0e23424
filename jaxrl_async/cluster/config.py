"""`ClusterConfig`: the typed `cluster=` group — where generation runs and how the trainer's processes join.

Each mode has its own config dataclass, built from `conf/cluster/<mode>.yaml` by
`planner.configs.build` (which also builds the nested `distributed` section):

- `local` (one process) and `slurm` (one JAX process per SLURM task): `ProcessConfig`, only the
  multi-host JAX settings (`cluster.distributed`, distributed.py);
- `ray`: `RayClusterConfig` (ray.py), the generation workers as Ray actors plus `distributed`.

`ClusterConfig` is what the run reads: the mode's name, its `DistributedConfig`, and the
`RayClusterConfig` when the mode is `ray`. To add a mode: its dataclass (with a `distributed`
field) under its name in CLUSTER_MODES and a `conf/cluster/<name>.yaml`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from jaxrl_async.cluster.distributed import DistributedConfig
from jaxrl_async.cluster.ray import RayClusterConfig
from planner.configs import build, check


@dataclass(frozen=True)
class ProcessConfig:
    """`cluster=local` and `cluster=slurm`: the trainer's processes, generation in-process."""

    # Multi-host JAX for the trainer. `local` takes the default (mode auto), so the multiprocess /
    # sbatch / tpu launchers' environment (JAXRL_*, SLURM_*, TPU) still applies.
    distributed: DistributedConfig = field(default_factory=DistributedConfig)


CLUSTER_MODES: dict[str, type] = {"local": ProcessConfig, "ray": RayClusterConfig, "slurm": ProcessConfig}


@dataclass(frozen=True)
class ClusterConfig:
    """The `cluster=` group as the run reads it."""

    name: str  # one of CLUSTER_MODES
    distributed: DistributedConfig
    ray: RayClusterConfig | None = None  # cluster=ray only: the generation workers


def cluster_config(values: Mapping[str, Any]) -> ClusterConfig:
    """`{"name": <mode>, **its keys}` (a composed `conf/cluster/*.yaml`) -> `ClusterConfig`."""
    values = dict(values)
    name = values.pop("name", None)
    check(name in CLUSTER_MODES, "cluster.name", name, f"must be one of {tuple(CLUSTER_MODES)} (conf/cluster/*.yaml)")
    mode = build(CLUSTER_MODES[name], values, "cluster", what=f"key for cluster={name}")
    return ClusterConfig(name, mode.distributed, mode if isinstance(mode, RayClusterConfig) else None)
