"""Data-parallel engine replicas behind one `GenerationEngine` (`engine.replicas` > 1).

Each replica is a whole engine (a `JaxEngine` on its own mesh: slots, KV cache, priority queue
and worker thread of its own). This front:

- routes each request to the replica with the fewest live samples (queued or decoding; ties:
  the lowest index) — `base.least_loaded`, the rule `RayEngineProxy` uses for its workers.
  A request stays on its replica, so priorities order admission within each replica;
- sends `abort` to the replica that holds the request;
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


class ReplicatedEngine(GenerationEngine):
    """Several engines as one (see the module docstring). All methods run on one event loop."""

    def __init__(self, replicas: Sequence[GenerationEngine]):
        if not replicas:
            raise ValueError("ReplicatedEngine: replicas is empty; give at least one engine")
        self.replicas = list(replicas)
        self._owner: dict[str, int] = {}  # request id -> index of the replica holding it
        self._samples_left: dict[str, int] = {}  # request id -> samples not yet done
        self._load = [0] * len(self.replicas)  # live samples per replica
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
            self._release(rid, n)
            raise

    async def abort(self, request_id: str) -> None:
        index = self._owner.get(request_id)
        if index is not None:
            await self.replicas[index].abort(request_id)

    async def mark_critical(self, request_id: str) -> None:
        index = self._owner.get(request_id)
        if index is not None:
            await self.replicas[index].mark_critical(request_id)

    async def update_weights(self, params: Any, version: int) -> None:
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
            extra={"replicas": len(parts), "per_replica_active": [p.active_slots for p in parts]})

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
                    self._release(out.request_id, 1)
                self._out.put_nowait(out)
        except asyncio.CancelledError:
            raise
        except BaseException as error:  # noqa: BLE001 - the merged stream's reader must see it
            self._out.put_nowait(error)

    def _release(self, request_id: str, samples: int) -> None:
        """`samples` of the request are done (or never reached its replica)."""
        self._load[self._owner[request_id]] -= samples
        self._samples_left[request_id] -= samples
        if not self._samples_left[request_id]:
            del self._owner[request_id], self._samples_left[request_id]
