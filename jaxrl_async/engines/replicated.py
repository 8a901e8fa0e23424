"""Data-parallel engine replicas behind one `GenerationEngine` (`engine.replicas` > 1).

Each replica is a whole engine (a `JaxEngine` on its own mesh: slots, KV cache, priority queue
and worker thread of its own). This front:

- routes each request to the replica with the fewest live samples (queued or decoding; ties:
  the lowest index) — `base.least_loaded`, the rule `RayEngineProxy` uses for its workers.
  A request stays on its replica, so priorities order admission within each replica;
- sends `abort` to the replica that holds the request;
- `migrate` moves a request's unfinished samples, prefix kept, to the least loaded other replica
  when it is strictly less loaded than the source without the request's own samples (so a move
  never just swaps which replica is the crowded one); the replicas must be `Migratable`
  (engines/migration.py). The source delivers the samples' pending pieces before it answers, and
  its output pump forwards them before the target (in another thread, after a prefill) can
  produce the next piece, so each sample's pieces stay in order in the merged stream. An abort
  that arrives while a request is in transit is sent on once the move is over. A move and a
  weight push exclude each other (a move is refused during a push, a push waits for a move):
  outside a push every replica holds the same version, so a moved sample's next tokens are never
  on older weights than its prefix's — a sample's versions never go down, which the planner's
  start-version deadline (lookahead's refine_on_start) relies on;
- pushes new weights to every replica at once and returns when all of them use the version;
- merges the replicas' output streams into one; an error on one replica's stream ends the
  merged stream with that error, as it would for a single engine.

Left out: moving queued requests between replicas when one drains first (work stealing), and
weighting the load by prompt length; both would need the replicas' queues, not their counts.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator, Sequence
from typing import Any

from jaxrl_async.engines.base import (END_OF_OUTPUTS, EngineStats, EngineTiming, GenerationEngine,
                                      GenerationRequest, SampleOutput, check_new_request_id, least_loaded,
                                      read_outputs)
from jaxrl_async.engines.migration import Migratable


class ReplicatedEngine(GenerationEngine):
    """Several engines as one (see the module docstring). All methods run on one event loop."""

    def __init__(self, replicas: Sequence[GenerationEngine]):
        if not replicas:
            raise ValueError("ReplicatedEngine: replicas is empty; give at least one engine")
        self.replicas = list(replicas)
        self._owner: dict[str, int] = {}  # request id -> index of the replica holding it
        self._samples_left: dict[str, int] = {}  # request id -> samples not yet done
        self._load = [0] * len(self.replicas)  # live samples per replica
        self._moving: dict[str, bool] = {}  # request id in transit -> aborted meanwhile
        self._critical: set[str] = set()  # live request ids marked critical (a move carries the mark)
        self._exclusive = asyncio.Lock()  # held by a weight push or a move (module docstring)
        self._out: asyncio.Queue = asyncio.Queue()
        self._pumps: list[asyncio.Task] = []

    async def start(self) -> None:
        if self._pumps:
            raise RuntimeError("ReplicatedEngine.start: already started")
        await asyncio.gather(*(r.start() for r in self.replicas))
        loop = asyncio.get_running_loop()
        self._pumps = [loop.create_task(self._pump(i)) for i in range(len(self.replicas))]

    async def stop(self) -> None:
        await asyncio.gather(*(r.stop() for r in self.replicas))
        # Each pump ends at its replica's end of stream, so every output reaches the merged
        # stream before its end marker does.
        await asyncio.gather(*self._pumps, return_exceptions=True)
        self._out.put_nowait(END_OF_OUTPUTS)

    async def submit(self, request: GenerationRequest) -> None:
        rid, n = request.request_id, request.sampling.n
        check_new_request_id(rid, self._owner)
        index = least_loaded(dict(enumerate(self._load)))
        # Recorded before the await: a replica may deliver outputs before submit returns.
        self._owner[rid], self._samples_left[rid] = index, n
        self._load[index] += n
        try:
            await self.replicas[index].submit(request)
        except BaseException:
            self._release(rid, n, index)
            raise

    async def abort(self, request_id: str) -> None:
        if request_id in self._moving:
            self._moving[request_id] = True  # sent to the target once it holds the request
            return
        index = self._owner.get(request_id)
        if index is not None:
            await self.replicas[index].abort(request_id)

    async def mark_critical(self, request_id: str) -> None:
        index = self._owner.get(request_id)
        if index is not None:
            self._critical.add(request_id)
            await self.replicas[index].mark_critical(request_id)

    async def migrate(self, request_id: str) -> tuple[int, int] | None:
        src = self._owner.get(request_id)
        if src is None or len(self.replicas) < 2 or request_id in self._moving or self._exclusive.locked():
            return None
        source = self.replicas[src]
        others = {i: load for i, load in enumerate(self._load) if i != src}
        dst = least_loaded(others)
        target = self.replicas[dst]
        if not (others[dst] < self._load[src] - self._samples_left[request_id]
                and isinstance(source, Migratable) and isinstance(target, Migratable)):
            return None
        await self._exclusive.acquire()  # free (checked above, nothing awaited since): no wait
        self._moving[request_id] = False
        moved = None
        try:
            moved = await source.detach(request_id)
            if moved is not None:
                # Samples that finished before the detach were released on `src` by its pump.
                count = len(moved.samples)
                self._load[src] -= count
                self._load[dst] += count
                self._owner[request_id] = dst
                await target.attach(moved)
                if request_id in self._critical:  # the mark follows the request
                    await target.mark_critical(request_id)
        finally:
            self._exclusive.release()
            aborted = self._moving.pop(request_id)
        if aborted:  # to wherever the request is now
            await self.abort(request_id)
        return None if moved is None else (src, dst)

    async def update_weights(self, params: Any, version: int) -> None:
        async with self._exclusive:
            await asyncio.gather(*(r.update_weights(params, version) for r in self.replicas))

    def outputs(self) -> AsyncIterator[SampleOutput]:
        return read_outputs(self._out)

    async def stats(self) -> EngineStats:
        parts = await asyncio.gather(*(r.stats() for r in self.replicas))
        return EngineStats(
            active_slots=sum(p.active_slots for p in parts),
            total_slots=sum(p.total_slots for p in parts),
            queued=sum(p.queued for p in parts),
            busy_fraction=sum(p.busy_fraction for p in parts) / len(parts),
            version=min(p.version for p in parts),
            extra={"replicas": len(parts), "per_replica_active": [p.active_slots for p in parts],
                   **adapter_totals([p.extra.get("adapters") for p in parts])})

    def timings(self) -> list[EngineTiming]:
        """Every replica's timings, each tagged with its replica index, oldest first."""
        out = [dataclasses.replace(t, worker=i) for i, r in enumerate(self.replicas) for t in r.timings()]
        return sorted(out, key=lambda t: t.t)

    def worker_of(self, request_id: str) -> int:
        index = self._owner.get(request_id)
        return 0 if index is None else index

    def replica_of(self, request_id: str) -> int | None:
        """The index of the replica holding the request; None once it is done (or unknown)."""
        return self._owner.get(request_id)

    async def _pump(self, index: int) -> None:
        """Move one replica's outputs to the merged stream, counting finished samples."""
        try:
            async for out in self.replicas[index].outputs():
                if out.done:
                    self._release(out.request_id, 1, index)
                self._out.put_nowait(out)
        except asyncio.CancelledError:
            raise
        except BaseException as error:  # noqa: BLE001 - the merged stream's reader must see it
            self._out.put_nowait(error)

    def _release(self, request_id: str, samples: int, index: int) -> None:
        """`samples` of the request are done on replica `index` (or never reached it). The index
        is the replica's, not `_owner`'s: a sample that finished just before a migration is
        counted where it ran."""
        self._load[index] -= samples
        self._samples_left[request_id] -= samples
        if not self._samples_left[request_id]:
            del self._owner[request_id], self._samples_left[request_id]
            self._critical.discard(request_id)


def adapter_totals(parts: list[dict | None]) -> dict:
    """{"adapters": ...} over replicas that keep several adapter versions (engine.adapter_versions
    > 1): the versions any replica holds, the pushes summed; {} when none does."""
    parts = [p for p in parts if p]
    if not parts:
        return {}
    resident = sorted({v for p in parts for v in p["resident"]})
    return {"adapters": {"versions": parts[0]["versions"], "resident": resident,
                         "pushes_pinned": sum(p["pushes_pinned"] for p in parts),
                         "pushes_waited": sum(p["pushes_waited"] for p in parts)}}
