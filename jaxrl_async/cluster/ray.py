"""`cluster=ray`: generation engines (JAX or vLLM) as Ray actors behind one `GenerationEngine`.

    runtime ──GenerationEngine──► RayEngineProxy ──► EngineActor × num_workers (one per bundle)
                                                     └─ JaxEngine | VllmEngine, own process/GPUs

- `connect(cfg)` joins the cluster (one-line error when the address is unreachable) and checks
  that it has the GPUs asked for; `RayEngineProxy` reserves one placement-group bundle per worker
  (`gpus_per_worker` GPUs + `cpus_per_worker` CPUs, PACK or SPREAD), so workers never share GPUs.
- Each actor builds its engine from an `EngineSpec` (engine name, its config, model source) and
  runs it on the actor's own event loop. The proxy routes a request to the live worker with the
  fewest live requests, merges the workers' output streams (long polls), and broadcasts weight
  updates: the params are `ray.put` once, every worker fetches them.
- **Faults**: when a worker dies (its process killed, its node lost), every request it held is
  handed to `on_lost(request_ids)` — the runtime calls the planner's fault path
  (`policy.on_group_lost(uid, prefix_kept=False)`) and resubmits, so nothing is lost and the
  re-admission keeps the staleness bound (docs/design.md §2). With `restart_lost` a replacement worker is
  started (and given the newest weights) in the freed bundle. Without `on_lost` the loss is a
  one-line error on the output stream: silently dropping groups would break no-drop.
- **Liveness**: every call to a worker (`poll`, `submit`, `abort`, `update_weights`, `stats`,
  `stop`) has a deadline, `rpc_timeout_s` (a poll: its own wait plus that). A worker that does not
  answer in time — a hung or SIGSTOPped process, which Ray still reports alive — is treated as
  dead: it is `ray.kill`ed, its requests go to `on_lost` and a replacement takes its bundle, as
  above, with one warning line. The poll, every `poll_s`, is the heartbeat: a stopped worker is
  found within `poll_s + rpc_timeout_s` even when the runtime sends it nothing.

Left out: autoscaling, and moving in-flight prefixes between workers (lost requests restart).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from jaxrl_async.cluster.distributed import DistributedConfig
from jaxrl_async.engines.base import (END_OF_OUTPUTS, EngineStats, GenerationEngine, GenerationRequest,
                                      SampleOutput, check_new_request_id, least_loaded, read_outputs)
from planner.configs import check

STRATEGIES = ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RayClusterConfig:
    """`conf/cluster/ray.yaml`.

    Attributes:
      address: Ray cluster address ("auto": the cluster this machine joined with `ray start`;
        "local": start a private one in this process; "HOST:6379" or "ray://HOST:10001").
      num_workers: generation workers (one engine each).
      gpus_per_worker: GPUs reserved per worker (vLLM: its tensor_parallel_size; 0 on CPU).
      cpus_per_worker: CPUs reserved per worker.
      strategy: placement-group strategy for the worker bundles.
      restart_lost: start a replacement worker when one dies.
      placement_timeout_s: how long to wait for the bundles before failing.
      rpc_timeout_s: how long a worker may take to answer a call (the slowest weight push
        included) before it is treated as dead, killed and replaced.
      distributed: multi-host JAX for the trainer (`cluster.distributed.*`, see distributed.py).
    """

    address: str = "auto"
    num_workers: int = 1
    gpus_per_worker: float = 0
    cpus_per_worker: float = 1
    strategy: str = "PACK"
    restart_lost: bool = True
    placement_timeout_s: float = 60
    rpc_timeout_s: float = 120
    distributed: DistributedConfig = field(default_factory=DistributedConfig)

    def __post_init__(self) -> None:
        check(self.num_workers >= 1, "cluster.num_workers", self.num_workers, "must be >= 1")
        for name in ("gpus_per_worker", "cpus_per_worker"):
            check(getattr(self, name) >= 0, f"cluster.{name}", getattr(self, name), "must be >= 0")
        check(self.strategy in STRATEGIES, "cluster.strategy", self.strategy, f"must be one of {STRATEGIES}")
        for name in ("placement_timeout_s", "rpc_timeout_s"):
            check(getattr(self, name) > 0, f"cluster.{name}", getattr(self, name), "must be > 0 (seconds)")


@dataclass(frozen=True)
class EngineSpec:
    """What a worker builds: `engine`, a name in the engine registry, its config (the `engine.`
    keys without `name`), and the model (`models.loading.load_model` source + dtype)."""

    engine: str
    engine_config: dict
    model_source: str
    dtype: str | None = None

    def __post_init__(self) -> None:
        from jaxrl_async.engines.registry import ENGINES

        check(self.engine in ENGINES, "engine.name", self.engine, f"Ray workers run one of {tuple(ENGINES)}")


def build_engine(spec: EngineSpec) -> GenerationEngine:
    """The engine a worker runs, from the engine registry (also usable in-process)."""
    from jaxrl_async.engines import registry
    from jaxrl_async.models.loading import load_model

    loaded = load_model(spec.model_source, dtype=spec.dtype)
    config = registry.engine_config(spec.engine, spec.engine_config)
    # A worker is one replica; engine.tensor_parallel > 1 spreads a JAX engine over the worker's
    # devices (cluster.gpus_per_worker of them). vLLM places itself (tensor_parallel_size).
    facts = registry.entry_of(config).facts(config)
    tensor_parallel = facts.tensor_parallel
    mesh = None
    if tensor_parallel > 1 and not facts.places_itself:
        import jax

        from jaxrl_async.cluster.placement import replica_mesh

        local = jax.local_devices()
        check(tensor_parallel <= len(local), "engine.tensor_parallel", tensor_parallel,
              f"the Ray worker sees {len(local)} device(s); set cluster.gpus_per_worker to match")
        mesh = replica_mesh(local[:tensor_parallel])
    return registry.build_engine(spec.engine, config, loaded, mesh=mesh)


def connect(cfg: RayClusterConfig) -> None:
    """Join (or start) the Ray cluster and check its GPUs; one-line errors otherwise."""
    import ray

    if not ray.is_initialized():
        _check_reachable(cfg.address)
        try:
            if cfg.address == "local":
                ray.init(include_dashboard=False, log_to_driver=False)
            else:
                ray.init(address=cfg.address, log_to_driver=False)
        except (ConnectionError, RuntimeError, ValueError) as error:
            first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            raise ConnectionError(f"cluster.address={cfg.address!r}: cannot reach a Ray cluster ({first}); "
                                  "start one with `ray start --head` or fix the address") from None
    need = cfg.num_workers * cfg.gpus_per_worker
    have = ray.cluster_resources().get("GPU", 0)
    if need > have:
        raise ValueError(f"cluster.num_workers={cfg.num_workers} x gpus_per_worker={cfg.gpus_per_worker} "
                         f"needs {need:g} GPUs; the Ray cluster has {have:g}")


def _check_reachable(address: str, timeout_s: float = 5.0) -> None:
    """A TCP probe of a HOST:PORT address: `ray.init` itself retries a dead address for minutes."""
    import socket

    if address in ("auto", "local") or address.startswith("ray://"):
        return
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"cluster.address={address!r}: expected 'auto', 'local', 'HOST:PORT' or 'ray://HOST:PORT'")
    try:
        socket.create_connection((host, int(port)), timeout=timeout_s).close()
    except OSError as error:
        raise ConnectionError(f"cluster.address={address!r}: cannot reach a Ray cluster ({error}); "
                              "start one with `ray start --head` or fix the address") from None


class EngineActor:
    """A worker: one engine on the actor's event loop. Wrapped with `ray.remote` by the proxy."""

    def __init__(self, spec: EngineSpec):
        self.spec = spec
        self.engine: GenerationEngine | None = None
        self._pending: list[SampleOutput] = []
        self._ready = asyncio.Event()
        self._pump_task = None
        self._error: BaseException | None = None

    async def start(self) -> int:
        import os

        self.engine = build_engine(self.spec)
        await self.engine.start()
        self._pump_task = asyncio.get_running_loop().create_task(self._pump())
        return os.getpid()

    async def _pump(self) -> None:
        try:
            async for out in self.engine.outputs():
                self._pending.append(out)
                self._ready.set()
        except BaseException as error:  # noqa: BLE001 - re-raised in the proxy by poll()
            self._error = error
            self._ready.set()

    async def submit(self, request: GenerationRequest) -> None:
        await self.engine.submit(request)

    async def abort(self, request_id: str) -> None:
        await self.engine.abort(request_id)

    async def update_weights(self, params: Any, version: int) -> None:
        await self.engine.update_weights(params, version)

    async def stats(self) -> EngineStats:
        return await self.engine.stats()

    async def poll(self, timeout: float) -> list[SampleOutput]:
        """The outputs since the last poll; waits up to `timeout` s for the first one."""
        if not self._pending and self._error is None:
            try:
                await asyncio.wait_for(self._ready.wait(), timeout)
            except asyncio.TimeoutError:
                pass
        if self._error is not None:
            raise self._error
        out, self._pending = self._pending, []
        self._ready.clear()
        return out

    async def stop(self) -> None:
        await self.engine.stop()


@dataclass
class _Worker:
    index: int
    actor: Any
    pid: int
    live: set[str] = field(default_factory=set)
    alive: bool = True


class _WorkerLost(Exception):
    """A call to a worker that died or did not answer in time (the worker is already handled)."""


class RayEngineProxy(GenerationEngine):
    """Ray actors behind the `GenerationEngine` contract (see the module docstring)."""

    def __init__(self, spec: EngineSpec, cluster: RayClusterConfig,
                 on_lost: Callable[[list[str]], None] | None = None, poll_s: float = 0.5):
        self.spec, self.cluster, self.on_lost, self.poll_s = spec, cluster, on_lost, poll_s
        self.workers: list[_Worker] = []
        self._owner: dict[str, _Worker] = {}  # request id -> worker holding it
        self._samples_left: dict[str, int] = {}
        self._out: asyncio.Queue = asyncio.Queue()
        self._tasks: list[asyncio.Task] = []
        self._latest: tuple[Any, int] | None = None  # (params ref, version) for replacements
        self._placement = None
        self._version = 0
        self._replacing = 0  # replacement workers being started

    async def start(self) -> None:
        import ray
        from ray.util.placement_group import placement_group

        connect(self.cluster)
        c = self.cluster
        bundle = {"CPU": c.cpus_per_worker, **({"GPU": c.gpus_per_worker} if c.gpus_per_worker else {})}
        self._placement = placement_group([bundle] * c.num_workers, strategy=c.strategy)
        try:
            await asyncio.wait_for(self._placement.ready(), c.placement_timeout_s)
        except asyncio.TimeoutError:
            raise ValueError(f"cluster: {c.num_workers} bundles of {bundle} were not placed within "
                             f"{c.placement_timeout_s:g} s; the Ray cluster has {ray.available_resources()}") from None
        await asyncio.gather(*(self._spawn(i) for i in range(c.num_workers)))

    async def _spawn(self, index: int) -> _Worker:
        import ray
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        c = self.cluster
        remote = ray.remote(EngineActor).options(
            num_cpus=c.cpus_per_worker, num_gpus=c.gpus_per_worker, max_concurrency=64,
            scheduling_strategy=PlacementGroupSchedulingStrategy(self._placement, placement_group_bundle_index=index))
        actor = remote.remote(self.spec)
        pid = await actor.start.remote()  # no deadline: loading and compiling a model takes what it takes
        # A push that lands while this worker loads the latest weights only reaches the workers
        # already listed, so load again until nothing newer arrived. No await separates the last
        # check from joining the list, so no push can slip in between.
        pushed = None
        while self._latest is not None and self._latest is not pushed:
            pushed = self._latest
            await actor.update_weights.remote(*pushed)
        worker = _Worker(index, actor, pid)
        self.workers = [w for w in self.workers if w.index != index] + [worker]
        self._tasks.append(asyncio.get_running_loop().create_task(self._read(worker)))
        return worker

    async def _call(self, worker: _Worker, method: str, *args: Any, timeout_s: float | None = None) -> Any:
        """`worker.actor.<method>.remote(*args)`, awaited for at most `timeout_s` (default
        `rpc_timeout_s`). A worker that died or did not answer is lost (`_lose`): `_WorkerLost`."""
        import ray

        timeout_s = self.cluster.rpc_timeout_s if timeout_s is None else timeout_s
        try:
            return await asyncio.wait_for(getattr(worker.actor, method).remote(*args), timeout_s)
        except asyncio.TimeoutError:
            self._lose(worker, f"did not answer {method} within {timeout_s:g} s (hung or stopped)")
        except ray.exceptions.RayActorError:
            self._lose(worker, "died")
        raise _WorkerLost

    async def _read(self, worker: _Worker) -> None:
        """The worker's output stream, one long poll at a time; a poll is also its heartbeat."""
        try:
            while worker.alive:
                for out in await self._call(worker, "poll", self.poll_s,
                                            timeout_s=self.poll_s + self.cluster.rpc_timeout_s):
                    if out.done:
                        self._samples_left[out.request_id] -= 1
                        if not self._samples_left[out.request_id]:
                            del self._samples_left[out.request_id]
                            self._owner.pop(out.request_id, None)
                            worker.live.discard(out.request_id)
                    self._out.put_nowait(out)
        except _WorkerLost:
            return
        except BaseException as error:  # noqa: BLE001 - the stream owner must see it
            if not isinstance(error, asyncio.CancelledError):
                self._out.put_nowait(error)
            raise

    def _lose(self, worker: _Worker, why: str) -> None:
        """`worker` is dead to the run: kill it (a hung process still holds its bundle), hand its
        requests to `on_lost` and start a replacement (`_replace`). Idempotent."""
        import ray

        if not worker.alive:
            return
        worker.alive = False
        lost = sorted(worker.live)
        for rid in lost:
            self._owner.pop(rid, None)
            self._samples_left.pop(rid, None)
        worker.live.clear()
        log.warning("generation worker %d (pid %d) %s: killed; its %d requests go to the fault path%s",
                    worker.index, worker.pid, why, len(lost),
                    ", a replacement starts" if self.cluster.restart_lost and self.on_lost is not None else "")
        try:
            ray.kill(worker.actor, no_restart=True)
        except Exception:  # noqa: BLE001 - already gone
            pass
        if self.on_lost is None:
            self._out.put_nowait(RuntimeError(
                f"generation worker {worker.index} (pid {worker.pid}) {why} holding {len(lost)} requests "
                "and no on_lost handler was given"))
            return
        self._replacing += int(self.cluster.restart_lost)
        self._tasks.append(asyncio.get_running_loop().create_task(self._replace(worker.index, lost)))

    async def _replace(self, index: int, lost: list[str]) -> None:
        """A replacement first (it loads the newest weights before it joins), then the fault path,
        so that a one-worker cluster has a worker to resubmit to."""
        try:
            if self.cluster.restart_lost:
                try:
                    await self._spawn(index)
                finally:
                    self._replacing -= 1
            if lost:
                self.on_lost(lost)
        except asyncio.CancelledError:
            raise
        except BaseException as error:  # noqa: BLE001 - the stream owner must see it
            self._out.put_nowait(error)

    async def stop(self) -> None:
        import ray

        for w in self.workers:
            w.alive = False
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for w in self.workers:
            try:
                await asyncio.wait_for(w.actor.stop.remote(), self.cluster.rpc_timeout_s)
            except (ray.exceptions.RayActorError, asyncio.TimeoutError):
                pass
            ray.kill(w.actor)
        if self._placement is not None:
            ray.util.remove_placement_group(self._placement)
        self._out.put_nowait(END_OF_OUTPUTS)

    async def _live_workers(self) -> list[_Worker]:
        """The live workers; while none is but a replacement is starting, wait for it."""
        while True:
            live = [w for w in self.workers if w.alive]
            if live or not self._replacing:
                return live
            await asyncio.sleep(self.poll_s / 5)

    async def submit(self, request: GenerationRequest) -> None:
        check_new_request_id(request.request_id, self._owner)
        live = await self._live_workers()
        if not live:
            raise RuntimeError("cluster: no live generation worker")
        by_index = {w.index: w for w in live}
        worker = by_index[least_loaded({w.index: len(w.live) for w in live})]
        # Registered before the call: the worker's poll may return the request's last piece
        # before this call's answer does (a short request on an idle worker).
        worker.live.add(request.request_id)
        self._owner[request.request_id] = worker
        self._samples_left[request.request_id] = request.sampling.n
        try:
            await self._call(worker, "submit", request)
        except _WorkerLost:
            pass  # lost with the worker's other requests: `_lose` handed it to the fault path

    async def abort(self, request_id: str) -> None:
        worker = self._owner.get(request_id)
        if worker is not None and worker.alive:
            try:
                await self._call(worker, "abort", request_id)
            except _WorkerLost:
                pass  # its requests, this one included, went to the fault path

    async def update_weights(self, params: Any, version: int) -> None:
        import ray

        if version < self._version:
            raise ValueError(f"update_weights: version={version} goes backwards (workers hold {self._version})")
        ref = ray.put(params)
        self._latest = (ref, version)
        live = [w for w in self.workers if w.alive]
        results = await asyncio.gather(*(self._call(w, "update_weights", ref, version) for w in live),
                                       return_exceptions=True)
        for r in results:
            if isinstance(r, BaseException) and not isinstance(r, _WorkerLost):
                raise r  # a refused push (ValueError naming the leaf) from the first worker that refused
        self._version = version

    def outputs(self) -> AsyncIterator[SampleOutput]:
        return read_outputs(self._out)

    def worker_of(self, request_id: str) -> int:
        worker = self._owner.get(request_id)
        return 0 if worker is None else worker.index

    async def stats(self) -> EngineStats:
        live = [w for w in self.workers if w.alive]
        parts = await asyncio.gather(*(self._call(w, "stats") for w in live), return_exceptions=True)
        parts = [p for p in parts if isinstance(p, EngineStats)]
        n = max(1, len(parts))
        return EngineStats(
            active_slots=sum(p.active_slots for p in parts), total_slots=sum(p.total_slots for p in parts),
            queued=sum(p.queued for p in parts), busy_fraction=sum(p.busy_fraction for p in parts) / n,
            version=min((p.version for p in parts), default=self._version),
            extra={"workers": len(parts), "pids": [w.pid for w in self.workers if w.alive]})
