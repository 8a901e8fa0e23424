"""Hand-written stand-ins for Ray's actors, for the proxy's liveness logic without Ray.

`FakeActors` has the methods `RayEngineProxy` asks of `cluster.ray.proxy.RayActors` (reserve, spawn,
put, kill, release, is_death, cause). Each `FakeActor` answers `<method>.remote(*args)` with a
coroutine, as a Ray ObjectRef is awaited. A request finishes one piece per sample at its next
poll (timed as one decode iteration on a clock `clock_offset_s` away from the driver's, as on
another node); `freeze()` is SIGSTOP: from then on no call of it ever answers, and Ray (here: the fake)
still reports it alive.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from typing import Any

from jaxrl_async.cluster.ray.actor import PollAnswer
from jaxrl_async.engines.base import EngineStats, EngineTiming, GenerationRequest, SampleOutput

_pids = itertools.count(1000)


class _Method:
    def __init__(self, actor: FakeActor, name: str):
        self.actor, self.name = actor, name

    def remote(self, *args: Any):
        return self.actor.call(self.name, *args)


class FakeActor:
    def __init__(self, index: int, *, latency_s: float = 0.0, clock_offset_s: float = 0.0):
        self.index, self.pid, self.latency_s = index, next(_pids), latency_s
        self.clock_offset_s = clock_offset_s
        self.frozen = asyncio.Event()
        self.killed = False
        self.version = 0
        self.queue: list[GenerationRequest] = []
        self.calls: list[str] = []  # method names, in the order they ran
        self.critical: list[str] = []  # request ids marked critical, in order
        self.served = 0  # requests finished

    def __getattr__(self, name: str) -> _Method:
        if name.startswith("_") or name in ("index", "pid", "latency_s", "clock_offset_s", "frozen", "killed",
                                            "version", "queue", "calls", "critical", "served"):
            raise AttributeError(name)
        return _Method(self, name)

    def freeze(self) -> None:
        self.frozen.set()

    async def call(self, name: str, *args: Any) -> Any:
        if self.frozen.is_set():
            await asyncio.Event().wait()  # never answers
        if self.latency_s:
            await asyncio.sleep(self.latency_s)
        if self.frozen.is_set():
            await asyncio.Event().wait()
        self.calls.append(name)
        return await getattr(self, f"do_{name}")(*args)

    async def do_start(self) -> int:
        return self.pid

    async def do_submit(self, request: GenerationRequest) -> None:
        self.queue.append(request)

    async def do_abort(self, request_id: str) -> None:
        self.queue = [r for r in self.queue if r.request_id != request_id]

    async def do_mark_critical(self, request_id: str) -> None:
        self.critical.append(request_id)

    async def do_update_weights(self, params: Any, version: int) -> None:
        self.version = version

    async def do_stop(self) -> None:
        pass

    async def do_poll(self, timeout: float) -> PollAnswer:
        if not self.queue:
            await asyncio.sleep(timeout)
        out = [SampleOutput(r.request_id, i, [7], [0.0], [[self.version, 1]], "length", True)
               for r in self.queue for i in range(r.sampling.n)]
        self.served += len(self.queue)
        self.queue = []
        clock = time.monotonic() + self.clock_offset_s
        timings = [EngineTiming("decode", 0, clock - 0.001, 0.001, steps=1, tokens=len(out))] if out else []
        return PollAnswer(out, EngineStats(len(out), 4, 0, 0.5, self.version), timings, clock)


class FakeActors:
    """The `RayActors` stand-in: `spawned` lists every actor in start order."""

    def __init__(self, latency_s: float = 0.0, clock_offset_s: float = 0.0):
        self.latency_s, self.clock_offset_s = latency_s, clock_offset_s
        self.spawned: list[FakeActor] = []

    async def reserve(self) -> None:
        pass

    def spawn(self, index: int) -> FakeActor:
        actor = FakeActor(index, latency_s=self.latency_s, clock_offset_s=self.clock_offset_s)
        self.spawned.append(actor)
        return actor

    def put(self, value: Any) -> Any:
        return value

    def kill(self, actor: FakeActor) -> None:
        actor.killed = True

    def release(self) -> None:
        pass

    def is_death(self, error: BaseException) -> bool:
        return False

    def cause(self, error: BaseException) -> BaseException:
        return error
