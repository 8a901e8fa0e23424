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
- **Liveness, per worker**: every call to a worker (`poll`, `submit`, `abort`, `update_weights`,
  `stop`) has its own deadline (cluster/deadlines.py: clamp(20 x p99 of that kind's observed
  answer times, `rpc_timeout_floor_s`, `rpc_timeout_ceiling_s`), or the fixed `rpc_timeout_s`;
  a poll: its own wait plus that), and no call waits on all workers together, so one stopped
  worker never holds up the others: `stats()` reads what each worker's latest poll brought,
  `submit` / `abort` return once sent (a task awaits the answer), and `update_weights` waits for
  a worker that does not answer only 3x the first answer time (at least 1 s); a worker still
  behind gets no new request until it holds the new weights (the start barrier). A worker that
  misses its deadline — a hung or SIGSTOPped process, which Ray still reports alive — is treated
  as dead: it is `ray.kill`ed, its requests go to `on_lost` and a replacement takes its bundle,
  as above, with one warning line. The poll, every `poll_s`, is the heartbeat: a stopped worker
  is found within `poll_s` plus its poll deadline (~10 s) even when the runtime sends it nothing.
- `connect` runs `ray.init` under a deadline (`init_timeout_s`): Ray's own retries have none.

Left out: autoscaling, and moving in-flight prefixes between workers (lost requests restart).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from jaxrl_async.cluster.deadlines import RpcDeadlines
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
        if cfg.address == "local":
            error = _init_within(cfg, lambda: ray.init(include_dashboard=False, log_to_driver=False))
        else:
            error = _init_within(cfg, lambda: ray.init(address=cfg.address, log_to_driver=False))
        if error is not None:
            first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            raise ConnectionError(f"cluster.address={cfg.address!r}: cannot reach a Ray cluster ({first}); "
                                  "start one with `ray start --head` or fix the address") from None
    need = cfg.num_workers * cfg.gpus_per_worker
    have = ray.cluster_resources().get("GPU", 0)
    if need > have:
        raise ValueError(f"cluster.num_workers={cfg.num_workers} x gpus_per_worker={cfg.gpus_per_worker} "
                         f"needs {need:g} GPUs; the Ray cluster has {have:g}")


def _init_within(cfg: RayClusterConfig, init: Callable[[], None]) -> BaseException | None:
    """`init()` (`ray.init`) with a deadline, `cluster.init_timeout_s`: in a daemon thread, since
    Ray's own retries have none (a head started on 127.0.0.1 answers the TCP probe, then `ray.init`
    retries the host's interface address for ever). Returns the connection error it raised, if any;
    past the deadline, a one-line ConnectionError naming the fixes."""
    outcome: list[BaseException | None] = []

    def run() -> None:
        try:
            init()
            outcome.append(None)
        except BaseException as error:  # noqa: BLE001 - sorted and re-raised in the caller's thread
            outcome.append(error)

    thread = threading.Thread(target=run, name="ray-init", daemon=True)
    thread.start()
    thread.join(cfg.init_timeout_s)
    if not outcome:
        raise ConnectionError(
            f"cluster.address={cfg.address!r}: ray.init did not finish within cluster.init_timeout_s="
            f"{cfg.init_timeout_s:g} s; a head on 127.0.0.1 needs RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 in this "
            "process's environment (Ray swaps the loopback for the interface address), a remote head "
            "`ray start --head --node-ip-address=<reachable address>`")
    error = outcome[0]
    if error is not None and not isinstance(error, (ConnectionError, RuntimeError, ValueError)):
        raise error
    return error


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

    async def poll(self, timeout: float) -> tuple[list[SampleOutput], EngineStats]:
        """The outputs since the last poll (waits up to `timeout` s for the first one) and the
        engine's stats: the heartbeat carries them, so the proxy never asks a worker for stats."""
        if not self._pending and self._error is None:
            try:
                await asyncio.wait_for(self._ready.wait(), timeout)
            except asyncio.TimeoutError:
                pass
        if self._error is not None:
            raise self._error
        out, self._pending = self._pending, []
        self._ready.clear()
        return out, await self.engine.stats()

    async def stop(self) -> None:
        await self.engine.stop()


class RayActors:
    """What the proxy asks of Ray: the bundles, the actors, the object store, and what an error
    means. Tests hand the proxy a fake with the same methods (tests/helpers/fake_ray.py)."""

    def __init__(self, spec: EngineSpec, cluster: RayClusterConfig):
        self.spec, self.cluster = spec, cluster
        self._placement = None

    async def reserve(self) -> None:
        """Join the cluster and reserve one bundle per worker (one-line errors otherwise)."""
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

    def spawn(self, index: int) -> Any:
        """An `EngineActor` in bundle `index` (not started)."""
        import ray
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        c = self.cluster
        remote = ray.remote(EngineActor).options(
            num_cpus=c.cpus_per_worker, num_gpus=c.gpus_per_worker, max_concurrency=64,
            scheduling_strategy=PlacementGroupSchedulingStrategy(self._placement, placement_group_bundle_index=index))
        return remote.remote(self.spec)

    def put(self, value: Any) -> Any:
        import ray

        return ray.put(value)

    def kill(self, actor: Any) -> None:
        import ray

        try:
            ray.kill(actor, no_restart=True)
        except Exception:  # noqa: BLE001 - already gone
            pass

    def release(self) -> None:
        import ray

        if self._placement is not None:
            ray.util.remove_placement_group(self._placement)

    def is_death(self, error: BaseException) -> bool:
        """The actor's process or node is gone (as opposed to a call that raised)."""
        import ray

        return isinstance(error, ray.exceptions.RayActorError)

    def cause(self, error: BaseException) -> BaseException:
        """What the worker's method raised: a `RayTaskError` carries the remote traceback in its
        text (a one-line ValueError becomes 14 lines); the cause is the error the user can act on."""
        import ray

        if isinstance(error, ray.exceptions.RayTaskError) and isinstance(error.cause, BaseException):
            return error.cause
        return error


@dataclass
class _Worker:
    index: int
    actor: Any
    pid: int
    live: set[str] = field(default_factory=set)
    alive: bool = True
    version: int = 0  # the newest weights it acknowledged
    stats: EngineStats | None = None  # from its latest poll answer
    heard: float = 0.0  # monotonic time of its latest answer (the heartbeat)
    pushing: bool = False  # a weight push to it is in flight
    submits: dict[str, asyncio.Task] = field(default_factory=dict)  # submit calls not yet answered


class _WorkerLost(Exception):
    """A call to a worker that died or did not answer in time (the worker is already handled)."""


class RayEngineProxy(GenerationEngine):
    """Ray actors behind the `GenerationEngine` contract (see the module docstring)."""

    def __init__(self, spec: EngineSpec, cluster: RayClusterConfig,
                 on_lost: Callable[[list[str]], None] | None = None, poll_s: float = 0.5,
                 actors: Any = None):
        self.spec, self.cluster, self.on_lost, self.poll_s = spec, cluster, on_lost, poll_s
        self.actors = RayActors(spec, cluster) if actors is None else actors
        self.deadlines = RpcDeadlines(floor_s=cluster.rpc_timeout_floor_s, ceiling_s=cluster.rpc_timeout_ceiling_s,
                                      override_s=cluster.rpc_timeout_s)
        self.workers: list[_Worker] = []
        self._owner: dict[str, _Worker] = {}  # request id -> worker holding it
        self._samples_left: dict[str, int] = {}
        self._out: asyncio.Queue = asyncio.Queue()
        self._tasks: list[asyncio.Task] = []
        self._latest: tuple[Any, int] | None = None  # (params ref, version) for replacements
        self._version = 0  # the newest version update_weights returned for
        self._replacing = 0  # replacement workers being started
        self._push_error: BaseException | None = None  # a push a worker refused
        self._changed = asyncio.Event()  # a worker answered a push, or was lost

    async def start(self) -> None:
        await self.actors.reserve()
        await asyncio.gather(*(self._spawn(i) for i in range(self.cluster.num_workers)))

    async def _spawn(self, index: int) -> _Worker:
        actor = self.actors.spawn(index)
        pid = await actor.start.remote()  # no deadline: loading and compiling a model takes what it takes
        # A push that lands while this worker loads the latest weights only reaches the workers
        # already listed, so load again until nothing newer arrived. No await separates the last
        # check from joining the list, so no push can slip in between.
        pushed, version = None, 0
        while self._latest is not None and self._latest is not pushed:
            pushed = self._latest
            await actor.update_weights.remote(*pushed)
            version = pushed[1]
        worker = _Worker(index, actor, pid, version=version, heard=time.monotonic())
        self.workers = [w for w in self.workers if w.index != index] + [worker]
        self._tasks.append(asyncio.get_running_loop().create_task(self._read(worker)))
        return worker

    async def _call(self, worker: _Worker, kind: str, *args: Any, wait_s: float = 0.0) -> Any:
        """`worker.actor.<kind>.remote(*args)`, awaited for at most its own deadline
        (`RpcDeadlines.timeout_s(kind)`, plus `wait_s` the call itself waits). Only this worker's
        call is waited for. A worker that died or did not answer is lost (`_lose`): `_WorkerLost`.
        An error the method raised is re-raised as its cause (one line, not Ray's traceback)."""
        timeout_s = wait_s + self.deadlines.timeout_s(kind)
        t0 = time.monotonic()
        try:
            result = await asyncio.wait_for(getattr(worker.actor, kind).remote(*args), timeout_s)
        except asyncio.TimeoutError:
            self._lose(worker, f"did not answer {kind} within {timeout_s:g} s (hung or stopped)")
            raise _WorkerLost from None
        except Exception as error:  # noqa: BLE001 - sorted into a death or the method's own error
            if self.actors.is_death(error):
                self._lose(worker, "died")
                raise _WorkerLost from None
            raise self.actors.cause(error) from None
        worker.heard = time.monotonic()
        self.deadlines.observe(kind, max(0.0, worker.heard - t0 - wait_s))
        return result

    async def _read(self, worker: _Worker) -> None:
        """The worker's output stream, one long poll at a time; a poll is also its heartbeat and
        brings its stats, so `stats()` never waits on a worker."""
        try:
            while worker.alive:
                outputs, worker.stats = await self._call(worker, "poll", self.poll_s, wait_s=self.poll_s)
                for out in outputs:
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

    def _late(self, worker: _Worker) -> bool:
        """Suspect: not heard from for a poll plus `late_s` (alive to the run, but given no new work)."""
        return time.monotonic() - worker.heard > self.poll_s + self.deadlines.late_s("poll")

    def _lose(self, worker: _Worker, why: str) -> None:
        """`worker` is dead to the run: kill it (a hung process still holds its bundle), hand its
        requests to `on_lost` and start a replacement (`_replace`). Idempotent."""
        if not worker.alive:
            return
        worker.alive = False
        self._changed.set()
        lost = sorted(worker.live)
        for rid in lost:
            self._owner.pop(rid, None)
            self._samples_left.pop(rid, None)
        worker.live.clear()
        log.warning("generation worker %d (pid %d) %s: killed; its %d requests go to the fault path%s",
                    worker.index, worker.pid, why, len(lost),
                    ", a replacement starts" if self.cluster.restart_lost and self.on_lost is not None else "")
        self.actors.kill(worker.actor)
        if self.on_lost is None:
            self._out.put_nowait(RuntimeError(
                f"generation worker {worker.index} (pid {worker.pid}) {why} holding {len(lost)} requests "
                "and no on_lost handler was given"))
            return
        self._replacing += int(self.cluster.restart_lost)
        self._tasks.append(asyncio.get_running_loop().create_task(self._replace(worker.index, lost)))

    async def _replace(self, index: int, lost: list[str]) -> None:
        """The fault path at once while another worker lives (it takes the resubmissions); else a
        replacement first (it loads the newest weights before it joins), so that a one-worker
        cluster has a worker to resubmit to."""
        try:
            if lost and any(w.alive for w in self.workers):
                self.on_lost(lost)
                lost = []
            if self.cluster.restart_lost:
                try:
                    await self._spawn(index)
                finally:
                    self._replacing -= 1
                    self._changed.set()
            if lost:
                self.on_lost(lost)
        except asyncio.CancelledError:
            raise
        except BaseException as error:  # noqa: BLE001 - the stream owner must see it
            self._out.put_nowait(error)

    async def stop(self) -> None:
        """Stop the live workers (each within the deadline floor: stopping is quick, and a hung
        worker is killed regardless), kill every worker, release the bundles."""
        live = [w for w in self.workers if w.alive]
        for w in self.workers:
            w.alive = False
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

        async def stop_one(w: _Worker) -> None:
            if w in live:
                try:
                    await asyncio.wait_for(w.actor.stop.remote(),
                                           min(self.deadlines.timeout_s("stop"), self.deadlines.floor_s))
                except Exception:  # noqa: BLE001 - dead, hung or failing: it is killed below either way
                    pass
            self.actors.kill(w.actor)

        await asyncio.gather(*(stop_one(w) for w in self.workers))  # one hung worker delays no other's stop
        self.actors.release()
        self._out.put_nowait(END_OF_OUTPUTS)

    async def _ready_workers(self) -> list[_Worker]:
        """Where a new request may go: live workers that hold the newest returned weights (a
        request's start barrier, runtime/outbox.py), preferring those not late. While none holds
        them but one may (a push in flight, a replacement starting), wait."""
        while True:
            live = [w for w in self.workers if w.alive]
            current = [w for w in live if w.version >= self._version]
            fresh = [w for w in current if not self._late(w)]
            if fresh or current or not (live or self._replacing):
                return fresh or current
            await asyncio.sleep(self.poll_s / 5)

    async def submit(self, request: GenerationRequest) -> None:
        """Route `request` to the least-loaded ready worker and send it without waiting for the
        answer: a worker that stops answering never holds up the caller (the controller's lock).
        Its answer is awaited in a task, against its own deadline; a refusal (a prompt longer than
        the engine's context) ends the output stream with the worker's one-line error."""
        check_new_request_id(request.request_id, self._owner)
        ready = await self._ready_workers()
        if not ready:
            raise RuntimeError("cluster: no live generation worker")
        by_index = {w.index: w for w in ready}
        worker = by_index[least_loaded({w.index: len(w.live) for w in ready})]
        # Registered before the call: the worker's poll may return the request's last piece
        # before this call's answer does (a short request on an idle worker).
        worker.live.add(request.request_id)
        self._owner[request.request_id] = worker
        self._samples_left[request.request_id] = request.sampling.n
        task = asyncio.get_running_loop().create_task(self._send(worker, "submit", request))
        worker.submits[request.request_id] = task
        task.add_done_callback(lambda _: worker.submits.pop(request.request_id, None))
        self._tasks.append(task)

    async def _send(self, worker: _Worker, kind: str, *args: Any) -> None:
        """One call whose answer nobody waits for: a lost worker is already handled; any other
        error goes to the output stream's owner."""
        try:
            await self._call(worker, kind, *args)
        except _WorkerLost:
            pass  # lost with the worker's other requests: `_lose` handed them to the fault path
        except asyncio.CancelledError:
            raise
        except BaseException as error:  # noqa: BLE001 - the stream owner must see it
            self._out.put_nowait(error)

    async def abort(self, request_id: str) -> None:
        """Sent after the request's own submit was answered (an async actor may otherwise run
        the abort first), in a task: the caller never waits on the worker."""
        worker = self._owner.get(request_id)
        if worker is None or not worker.alive:
            return
        submitted = worker.submits.get(request_id)

        async def abort_after_submit() -> None:
            if submitted is not None:
                await asyncio.gather(submitted, return_exceptions=True)
            if worker.alive:
                await self._send(worker, "abort", request_id)

        self._tasks.append(asyncio.get_running_loop().create_task(abort_after_submit()))

    async def update_weights(self, params: Any, version: int) -> None:
        """Put the params once and push them to every live worker, each push against its own
        deadline. Returns once every live worker holds `version`, or once one does and the others
        had 3x its answer time (at least `late_floor_s`, 1 s) more: a stopped worker delays the
        push by about a second, not by its deadline.
        A worker still behind gets no new request until its push answers (`_ready_workers`),
        and is lost if it misses the deadline."""
        if version < self._version:
            raise ValueError(f"update_weights: version={version} goes backwards (workers hold {self._version})")
        self._latest = (self.actors.put(params), version)
        for w in self.workers:
            if w.alive and not w.pushing:
                self._tasks.append(asyncio.get_running_loop().create_task(self._push(w)))
        t0, first_ack_s = time.monotonic(), None
        while True:
            if self._push_error is not None:
                error, self._push_error = self._push_error, None
                raise error  # a refused push (ValueError naming the leaf) from the first worker that refused
            live = [w for w in self.workers if w.alive]
            behind = [w for w in live if w.version < version]
            if not behind or not live and not self._replacing:
                break
            if len(behind) < len(live):  # a worker holds it: wait for the others a while, not for ever
                first_ack_s = time.monotonic() - t0 if first_ack_s is None else first_ack_s
                if time.monotonic() - t0 > max(self.deadlines.late_floor_s, 3 * first_ack_s):
                    break
            self._changed.clear()
            try:
                await asyncio.wait_for(self._changed.wait(), self.poll_s / 5)
            except asyncio.TimeoutError:
                pass
        self._version = version

    async def _push(self, worker: _Worker) -> None:
        """Bring one worker to the newest pushed weights, one push at a time (an async actor may
        run two pushes out of order)."""
        worker.pushing = True
        try:
            while worker.alive and self._latest is not None and worker.version < self._latest[1]:
                ref, version = self._latest
                await self._call(worker, "update_weights", ref, version)
                worker.version = version
                self._changed.set()
        except _WorkerLost:
            pass
        except asyncio.CancelledError:
            raise
        except BaseException as error:  # noqa: BLE001 - update_weights raises it
            self._push_error = error
            self._changed.set()
        finally:
            worker.pushing = False

    def outputs(self) -> AsyncIterator[SampleOutput]:
        return read_outputs(self._out)

    def worker_of(self, request_id: str) -> int:
        worker = self._owner.get(request_id)
        return 0 if worker is None else worker.index

    async def stats(self) -> EngineStats:
        """The live workers' latest polled stats, summed; no call to any worker (a stopped one
        would hold up the caller). `version`: the oldest weights a live worker holds."""
        live = [w for w in self.workers if w.alive]
        parts = [w.stats for w in live if w.stats is not None]
        n = max(1, len(parts))
        return EngineStats(
            active_slots=sum(p.active_slots for p in parts), total_slots=sum(p.total_slots for p in parts),
            queued=sum(p.queued for p in parts), busy_fraction=sum(p.busy_fraction for p in parts) / n,
            version=min((w.version for w in live), default=self._version),
            extra={"workers": len(parts), "pids": [w.pid for w in live]})
