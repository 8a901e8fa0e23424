"""`RayEngineProxy`: the Ray actors (actor.py) behind one `GenerationEngine`, in the driver.

- Routing: a request goes to the live worker with the fewest live requests (`least_loaded`) and
  stays there; `abort` and `mark_critical` follow it to that worker (`worker_of`), each sent
  after the request's own submit was answered (an async actor may otherwise run it first).
- Outputs: one long poll per worker at a time, merged into one stream; a poll is also the
  worker's heartbeat and brings its stats, so `stats()` never calls a worker, and its timings,
  moved onto the driver's clock, so `timings()` feeds the run's trace and its draft counts.
- Weights: `ray.put` once, every worker fetches them; a worker still behind gets no new request
  until it holds the newest weights (the start barrier).
- Faults and liveness: see the package docstring (cluster/ray/__init__.py): a worker that died or
  missed its own deadline (cluster/deadlines.py) is killed, its requests go to `on_lost`, and a
  replacement takes its bundle.

`RayActors` is everything the proxy asks of Ray; tests hand the proxy a fake with the same
methods (tests/helpers/fake_ray.py).

Left out: `migrate` (moving a running request's prefix to another worker). It would need what
`ReplicatedEngine` does in-process (engines/replicated.py): the source's last pieces read before
the target's first, aborts and marks that arrive mid-move sent on, and moves excluded from weight
pushes so that a sample's versions never go down — across processes whose answers race. The
proxy keeps `GenerationEngine`'s answer, "nothing moved", and the job refuses
`policy.migrate=true` under this cluster at start-up (`ClusterFacts.migrates`, cluster/config.py),
so it is never silent.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from jaxrl_async.cluster.deadlines import RpcDeadlines
from jaxrl_async.cluster.ray.actor import EngineActor, EngineSpec
from jaxrl_async.cluster.ray.config import RayClusterConfig
from jaxrl_async.cluster.ray.connect import connect
from jaxrl_async.engines.base import (END_OF_OUTPUTS, EngineStats, EngineTiming, GenerationEngine,
                                      GenerationRequest, SampleOutput, check_new_request_id, least_loaded,
                                      read_outputs)

log = logging.getLogger(__name__)


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
        self._timings: list[EngineTiming] = []  # the workers' timings not yet read, on this clock
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
        brings its stats, so `stats()` never waits on a worker, and its timings."""
        try:
            while worker.alive:
                answer = await self._call(worker, "poll", self.poll_s, wait_s=self.poll_s)
                worker.stats = answer.stats
                # The worker's clock onto this process's: late by the answer's transit time at most.
                shift = time.monotonic() - answer.clock
                self._timings += [dataclasses.replace(t, worker=worker.index, t=t.t + shift) for t in answer.timings]
                for out in answer.outputs:
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
                timeout_s = min(self.deadlines.timeout_s("stop"), self.deadlines.floor_s)
                try:
                    await asyncio.wait_for(w.actor.stop.remote(), timeout_s)
                except asyncio.TimeoutError:  # a worker that hung at the run's end is named, not hidden
                    log.warning("generation worker %d (pid %d) did not answer stop within %g s (hung or stopped): "
                                "killed", w.index, w.pid, timeout_s)
                except Exception:  # noqa: BLE001 - dead or failing: it is killed below either way
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
        """End the request's unfinished samples on the worker that holds it (`_follow`)."""
        self._follow(request_id, "abort")

    async def mark_critical(self, request_id: str) -> None:
        """The worker that holds the request speculates its samples from now on
        (`engine.speculation.when=critical`; its engine ignores the mark otherwise). A request
        lost with its worker loses the mark: the planner marks its resubmission again."""
        self._follow(request_id, "mark_critical")

    def _follow(self, request_id: str, kind: str) -> None:
        """`kind(request_id)` to the worker that holds the request, sent after the request's own
        submit was answered (an async actor may otherwise run it first), in a task: the caller
        never waits on the worker. An unknown or finished id, or a lost worker's, is ignored."""
        worker = self._owner.get(request_id)
        if worker is None or not worker.alive:
            return
        submitted = worker.submits.get(request_id)

        async def after_submit() -> None:
            if submitted is not None:
                await asyncio.gather(submitted, return_exceptions=True)
            if worker.alive:
                await self._send(worker, kind, request_id)

        self._tasks.append(asyncio.get_running_loop().create_task(after_submit()))

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

    def timings(self) -> list[EngineTiming]:
        """The workers' timed work since the last call, oldest first, each tagged with its
        worker's index and moved onto this process's monotonic clock (`PollAnswer.clock`)."""
        out, self._timings = sorted(self._timings, key=lambda t: t.t), []
        return out

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
