"""`RayClusterConfig`: the keys of `cluster=ray` (`conf/cluster/ray.yaml`, `cluster.KEY=VALUE`).

Cheap to import: dataclasses and the config checks only, no ray, JAX or engine (tests/test_layers.py
holds it to that), so typing a config or printing `--help` never starts either. What the keys do
is in the package's docstring (cluster/ray/__init__.py); `cluster/config.py` states the mode's
facts from this dataclass.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from jaxrl_async.cluster.distributed import DistributedConfig
from planner.configs import check

STRATEGIES = ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")


@dataclass(frozen=True)
class RayClusterConfig:
    """`cluster=ray`: the generation engines as Ray actors, one placement-group bundle each.

    Attributes:
      address: Ray cluster address ("auto": the cluster this machine joined with `ray start`;
        "local": start a private one in this process; "HOST:6379" or "ray://HOST:10001").
      num_workers: generation workers, one engine replica each (`engine.replicas` must stay 1).
      gpus_per_worker: GPUs reserved per worker (vLLM: its tensor_parallel_size; JAX: at least
        engine.tensor_parallel; 0 on CPU).
      cpus_per_worker: CPUs reserved per worker (fractions share a CPU, e.g. 0.5 on a laptop).
      strategy: placement-group strategy for the worker bundles: PACK, SPREAD, STRICT_PACK or
        STRICT_SPREAD (Ray's meanings).
      restart_lost: start a replacement worker (given the newest weights) in the bundle of one
        that died; its requests go to the planner's fault path either way.
      placement_timeout_s: how long to wait for the bundles before failing with the cluster's
        free resources in the message.
      rpc_timeout_s: an explicit deadline (s) for every call to a worker, replacing the adaptive
        one; None (the default): each call kind's deadline is clamp(20 x p99 of its observed
        answer times, rpc_timeout_floor_s, rpc_timeout_ceiling_s) (cluster/deadlines.py). A worker
        that misses its own deadline is treated as dead, killed and replaced.
      rpc_timeout_floor_s: the adaptive deadline's floor: a stopped worker is found about this
        long (plus a poll) after its last answer.
      rpc_timeout_ceiling_s: the adaptive deadline's ceiling, and the deadline of a call kind
        not answered yet (the first weight push of a large model may be slow).
      init_timeout_s: how long joining the cluster (`ray.init`) may take before the run fails
        with a one-line error naming the usual fix.
      distributed: multi-host JAX for the trainer (`cluster.distributed.*`, see distributed.py).
    """

    address: str = "auto"
    num_workers: int = 1
    gpus_per_worker: float = 0
    cpus_per_worker: float = 1
    strategy: str = "PACK"
    restart_lost: bool = True
    placement_timeout_s: float = 60
    rpc_timeout_s: float | None = None
    rpc_timeout_floor_s: float = 10
    rpc_timeout_ceiling_s: float = 120
    init_timeout_s: float = 60
    distributed: DistributedConfig = field(default_factory=DistributedConfig)

    def __post_init__(self) -> None:
        check(self.num_workers >= 1, "cluster.num_workers", self.num_workers, "must be >= 1")
        for name in ("gpus_per_worker", "cpus_per_worker"):
            check(getattr(self, name) >= 0, f"cluster.{name}", getattr(self, name), "must be >= 0")
        check(self.strategy in STRATEGIES, "cluster.strategy", self.strategy, f"must be one of {STRATEGIES}")
        for name in ("placement_timeout_s", "rpc_timeout_s", "rpc_timeout_floor_s", "rpc_timeout_ceiling_s",
                     "init_timeout_s"):
            value = getattr(self, name)
            check(value is None and name == "rpc_timeout_s" or value is not None and value > 0,
                  f"cluster.{name}", value, "must be > 0 (seconds)")
        check(self.rpc_timeout_floor_s <= self.rpc_timeout_ceiling_s, "cluster.rpc_timeout_floor_s",
              self.rpc_timeout_floor_s, f"must be <= cluster.rpc_timeout_ceiling_s={self.rpc_timeout_ceiling_s}")
