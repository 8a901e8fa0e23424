"""Multi-host JAX: `jax.distributed.initialize` from SLURM, a TPU pod slice or an explicit coordinator.

After `initialize_distributed`, every process sees the global device list (`jax.devices()`), so
`jaxrl_async.sharding.make_mesh` builds one mesh over all hosts and the trainer's data-parallel
and FSDP axes span processes with no other change: each process runs the same program on the
same global batch (multi-controller SPMD) and XLA moves only the shards.

Where the three arguments come from (`DistributedConfig.mode`):
- `explicit`: `coordinator_address`, `num_processes`, `process_id` from the config, or else
  from `JAXRL_COORDINATOR_ADDRESS`, `JAXRL_NUM_PROCESSES`, `JAXRL_PROCESS_ID` (what the
  `multiprocess` and `tpu` launchers set, so the same command line serves every process).
- `slurm`: `SLURM_NTASKS`, `SLURM_PROCID` and the first host of `SLURM_STEP_NODELIST` (or
  `SLURM_JOB_NODELIST`) with `port`; one task per host (or per GPU) is the sbatch template's job.
- `tpu`: JAX's own TPU-pod detection (`jax.distributed.initialize()` with no arguments), which
  reads the TPU VM metadata; the launcher runs the same command on every worker.
- `auto`: the mode named by `JAXRL_DISTRIBUTED_MODE` if set (the tpu launcher sets it), else
  explicit if a coordinator is configured (config or env), else SLURM when `SLURM_NTASKS` > 1, else TPU
  when `TPU_WORKER_HOSTNAMES` names several hosts, else a single process (no initialize).
- `none`: single process.

A process count that disagrees with the environment (config says 2, SLURM says 4) or with what
JAX reports after start-up is a one-line ValueError: a silent mismatch would hang collectives.

To add another source (e.g. an MPI launcher), add a `_from_<name>(cfg, env)` resolver and its
name to `MODES`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from planner.configs import check

MODES = ("auto", "none", "explicit", "slurm", "tpu")
CPU_COLLECTIVES = ("gloo", "mpi", "none")


@dataclass(frozen=True)
class DistributedConfig:
    """How this process joins a multi-host JAX job (`cluster.distributed` in the Hydra config).

    Attributes:
      mode: one of MODES (see module docstring).
      coordinator_address: "host:port" of process 0 (explicit mode; `auto` picks explicit when set).
      num_processes: expected number of processes; None = take it from the environment. Set it
        to make a mismatch with SLURM / JAX an error at start-up instead of a hang.
      process_id: this process's rank (explicit mode).
      port: coordinator port for SLURM (the first node listens on it).
      cpu_collectives: cross-process collectives on CPU devices ("gloo" for tests and CPU
        clusters; "none" leaves JAX's default, which cannot reduce across processes on CPU).
      initialization_timeout_s: how long process 0 waits for the others.
    """

    mode: str = "auto"
    coordinator_address: str | None = None
    num_processes: int | None = None
    process_id: int | None = None
    port: int = 8476
    cpu_collectives: str = "gloo"
    initialization_timeout_s: int = 300

    def __post_init__(self) -> None:
        p = "cluster.distributed"
        check(self.mode in MODES, f"{p}.mode", self.mode, f"must be one of {MODES}")
        check(self.cpu_collectives in CPU_COLLECTIVES, f"{p}.cpu_collectives", self.cpu_collectives,
              f"must be one of {CPU_COLLECTIVES}")
        n, rank = self.num_processes, self.process_id
        check(n is None or n >= 1, f"{p}.num_processes", n, "must be >= 1")
        check(rank is None or n is None or 0 <= rank < n, f"{p}.process_id", rank, f"must be in [0, num_processes={n})")


@dataclass(frozen=True)
class InitArgs:
    """The arguments `jax.distributed.initialize` gets; all None = let JAX detect (TPU pods)."""

    source: str
    coordinator_address: str | None = None
    num_processes: int | None = None
    process_id: int | None = None


def first_slurm_host(nodelist: str) -> str:
    """The first host of a SLURM compressed node list: 'gpu[003-005,9],cpu1' -> 'gpu003'."""
    match = re.match(r"([^,\[]+)(?:\[([^\]]+)\])?", nodelist.strip())
    if match is None or not match.group(1):
        raise ValueError(f"SLURM node list {nodelist!r}: cannot read its first host")
    prefix, ranges = match.group(1), match.group(2)
    if ranges is None:
        return prefix
    return prefix + re.split(r"[-,]", ranges)[0]


def _from_explicit(cfg: DistributedConfig, env: Mapping[str, str]) -> InitArgs:
    address = cfg.coordinator_address or env.get("JAXRL_COORDINATOR_ADDRESS")
    count = cfg.num_processes if cfg.num_processes is not None else env.get("JAXRL_NUM_PROCESSES")
    rank = cfg.process_id if cfg.process_id is not None else env.get("JAXRL_PROCESS_ID")
    if address is None or count is None or rank is None:
        raise ValueError("cluster.distributed.mode=explicit needs coordinator_address, num_processes and "
                         f"process_id (or JAXRL_* env); got {address!r}, {count!r}, {rank!r}")
    count, rank = int(count), int(rank)
    if not 0 <= rank < count:
        raise ValueError(f"cluster.distributed process_id={rank}: must be in [0, num_processes={count})")
    return InitArgs("explicit", address, count, rank)


def _from_slurm(cfg: DistributedConfig, env: Mapping[str, str]) -> InitArgs:
    for key in ("SLURM_NTASKS", "SLURM_PROCID"):
        if key not in env:
            raise ValueError(f"cluster.distributed.mode=slurm but {key} is not set: run under srun/sbatch")
    nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST")
    if not nodelist:
        raise ValueError("cluster.distributed.mode=slurm but neither SLURM_STEP_NODELIST nor "
                         "SLURM_JOB_NODELIST is set")
    ntasks = int(env["SLURM_NTASKS"])
    if cfg.num_processes is not None and cfg.num_processes != ntasks:
        raise ValueError(f"cluster.distributed.num_processes={cfg.num_processes} but SLURM_NTASKS="
                         f"{ntasks}: make the sbatch --ntasks match or drop num_processes")
    return InitArgs("slurm", f"{first_slurm_host(nodelist)}:{cfg.port}", ntasks, int(env["SLURM_PROCID"]))


def _from_tpu(cfg: DistributedConfig, env: Mapping[str, str]) -> InitArgs:
    hosts = [h for h in env.get("TPU_WORKER_HOSTNAMES", "").split(",") if h]
    if cfg.num_processes is not None and hosts and cfg.num_processes != len(hosts):
        raise ValueError(f"cluster.distributed.num_processes={cfg.num_processes} but the TPU slice "
                         f"has {len(hosts)} workers (TPU_WORKER_HOSTNAMES)")
    return InitArgs("tpu")


def resolve(cfg: DistributedConfig, env: Mapping[str, str]) -> InitArgs | None:
    """What to pass to `jax.distributed.initialize` for this config and environment (None: single
    process). Pure: reads only its arguments, so launchers' dry runs and tests can call it."""
    mode = cfg.mode
    if mode == "auto" and env.get("JAXRL_DISTRIBUTED_MODE"):
        mode = env["JAXRL_DISTRIBUTED_MODE"]
        if mode not in MODES:
            raise ValueError(f"JAXRL_DISTRIBUTED_MODE={mode!r}: must be one of {MODES}")
    if mode == "auto":
        if cfg.coordinator_address is not None or "JAXRL_COORDINATOR_ADDRESS" in env:
            mode = "explicit"
        elif int(env.get("SLURM_NTASKS", "1")) > 1:
            mode = "slurm"
        elif len([h for h in env.get("TPU_WORKER_HOSTNAMES", "").split(",") if h]) > 1:
            mode = "tpu"
        else:
            mode = "none"
    if mode == "none":
        if cfg.num_processes not in (None, 1):
            raise ValueError(f"cluster.distributed.num_processes={cfg.num_processes} but no multi-host "
                             "environment was found (no coordinator_address, SLURM or TPU pod)")
        return None
    return {"explicit": _from_explicit, "slurm": _from_slurm, "tpu": _from_tpu}[mode](cfg, env)


def initialize_distributed(cfg: DistributedConfig, env: Mapping[str, str] | None = None) -> InitArgs | None:
    """Join the multi-host job described by `cfg` (no-op for a single process); returns what was
    used. Call before any other JAX call that touches devices."""
    import os

    import jax

    args = resolve(cfg, os.environ if env is None else env)
    if args is None:
        return None
    if cfg.cpu_collectives != "none":
        # CPU devices need a collectives backend to reduce across processes (tests, CPU clusters);
        # it is ignored by GPU / TPU backends.
        jax.config.update("jax_cpu_collectives_implementation", cfg.cpu_collectives)
    jax.distributed.initialize(
        coordinator_address=args.coordinator_address, num_processes=args.num_processes,
        process_id=args.process_id, initialization_timeout=cfg.initialization_timeout_s)
    expected = args.num_processes or cfg.num_processes
    if expected is not None and jax.process_count() != expected:
        raise ValueError(f"cluster.distributed: expected {expected} processes, JAX reports "
                         f"{jax.process_count()} after initialize ({args.source})")
    return args
