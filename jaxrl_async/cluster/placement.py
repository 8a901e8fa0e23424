"""Where the trainer and the JAX generation engines run, from `trainer.mesh` and `engine.*`.

The job's devices are `jax.devices()`: every process's, in JAX's order (process 0's first on
every backend we run on). The rules:

- **trainer**: a data × fsdp × tensor mesh over the first `trainer.mesh.size` devices of the job,
  spanning processes when it is larger than one process's devices. With one device and one
  process the trainer stays unsharded (`mesh=None`), exactly as a run without placement keys.
- **engines**: `engine.replicas` replicas of `engine.tensor_parallel` devices each, all on process
  0's local devices, because process 0 runs the controller that feeds them (generation on other
  hosts goes through `cluster=ray`). `engine.colocate=true` takes them from the trainer's devices
  on process 0 (time-shared: the engine decodes while the trainer waits, and the other way
  round); `false` takes process 0's devices that the trainer does not use, in order. One replica
  colocated with an unsharded trainer is today's engine on the default device (`mesh=None`);
  next to a sharded trainer it gets a one-device mesh, so the weight push regroups the trainer's
  shards on device (engines/jax/layout.py `regroup_for`) instead of reading them through the host.

Each replica gets a (1, 1, T) mesh with the trainer's axis names, so the same logical-axis table
(jaxrl_async/sharding.py) shards its weights and KV cache over `tensor`. A request for more
devices than exist is a one-line ValueError naming the keys and the counts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from jax.sharding import Mesh

from jaxrl_async.sharding import MESH_AXES
from jaxrl_async.trainer.config import MeshConfig


@dataclass(frozen=True)
class Placement:
    """The meshes a run builds; `summary()` counts what they hold."""

    processes: int
    trainer_mesh: Mesh | None  # None: one device, unsharded
    trainer_devices: tuple[Any, ...]
    engine_meshes: tuple[Mesh | None, ...]  # one per replica; (None,): the default device
    colocate: bool

    @property
    def engine_devices(self) -> tuple[Any, ...]:
        if self.engine_meshes == (None,):
            return self.trainer_devices[:1]
        return tuple(d for mesh in self.engine_meshes for d in mesh.devices.flat)

    def summary(self) -> dict[str, Any]:
        """summary.json's `placement` (docs/scale_out.md)."""
        mesh = dict(self.trainer_mesh.shape) if self.trainer_mesh is not None else \
            {axis: 1 for axis in MESH_AXES}
        tensor = 1 if self.engine_meshes == (None,) else self.engine_meshes[0].shape["tensor"]
        return {"processes": self.processes,
                "trainer": {"devices": len(self.trainer_devices), "mesh": mesh},
                "engine": {"devices": len(self.engine_devices), "replicas": len(self.engine_meshes),
                           "tensor_parallel": tensor, "colocate": self.colocate}}


def plan_placement(mesh: MeshConfig, *, replicas: int = 1, tensor_parallel: int = 1, colocate: bool = True,
                   devices: Sequence[Any] | None = None, leader_devices: Sequence[Any] | None = None,
                   processes: int | None = None) -> Placement:
    """The trainer's mesh and the engine replicas' meshes (see the module docstring).

    `devices` (all of the job's), `leader_devices` (process 0's) and `processes` default to what
    JAX reports; tests pass their own lists.
    """
    import jax

    devices = list(jax.devices() if devices is None else devices)
    leader_devices = list([d for d in devices if d.process_index == 0] if leader_devices is None
                          else leader_devices)
    processes = jax.process_count() if processes is None else processes
    if mesh.size > len(devices):
        raise ValueError(
            f"trainer.mesh: data={mesh.data} fsdp={mesh.fsdp} tensor={mesh.tensor} needs {mesh.size} devices; "
            f"this job has {len(devices)} ({processes} process(es)){_cpu_recipe(devices, processes, mesh.size)}")
    trainer_devices = tuple(devices[:mesh.size])
    holding = {d.process_index for d in trainer_devices}
    if processes > 1 and len(holding) < processes:
        # Every process follows the trainer's steps (cluster/lockstep.py): one without a shard
        # would be asked to run a computation on devices it cannot address.
        raise ValueError(
            f"trainer.mesh: data={mesh.data} fsdp={mesh.fsdp} tensor={mesh.tensor} covers the devices of "
            f"{len(holding)} of the job's {processes} processes; make it span all {len(devices)} devices")
    trainer_mesh = None
    if mesh.size > 1 or processes > 1:
        trainer_mesh = Mesh(np.asarray(trainer_devices, dtype=object).reshape(mesh.data, mesh.fsdp, mesh.tensor),
                            MESH_AXES)
    need = replicas * tensor_parallel
    if colocate:
        pool = [d for d in trainer_devices if d in leader_devices]
        where = f"the trainer's {len(pool)} device(s) on process 0 (engine.colocate=true)"
    else:
        pool = [d for d in leader_devices if d not in trainer_devices]
        where = f"the {len(pool)} device(s) of process 0 the trainer does not use (engine.colocate=false)"
    if need > len(pool):
        raise ValueError(f"engine.replicas={replicas} x engine.tensor_parallel={tensor_parallel} needs {need} "
                         f"devices; {where}{_cpu_recipe(devices, processes, mesh.size + need, ' and engine.colocate=false')}")
    if colocate and need == 1 and trainer_mesh is None:
        engine_meshes: tuple[Mesh | None, ...] = (None,)
    else:
        engine_meshes = tuple(replica_mesh(pool[r * tensor_parallel:(r + 1) * tensor_parallel])
                              for r in range(replicas))
    return Placement(processes, trainer_mesh, trainer_devices, engine_meshes, colocate)


def _cpu_recipe(devices: Sequence[Any], processes: int, count: int, keys: str = "") -> str:
    """How one CPU process gets `count` devices: XLA splits the host (for replicas, the trainer's
    devices and, apart from them, the engines': benchmarks/bench_tail_runtime.py runs this way)."""
    if processes > 1 or devices[0].platform != "cpu":
        return ""
    return f"; on CPU set XLA_FLAGS=--xla_force_host_platform_device_count={count}{keys}"


def replica_mesh(devices: Sequence[Any]) -> Mesh:
    """One engine replica's (1, 1, T) mesh: tensor parallel over `devices`."""
    return Mesh(np.asarray(list(devices), dtype=object).reshape(1, 1, -1), MESH_AXES)
