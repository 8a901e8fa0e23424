"""The worker side of `cluster=ray`: what one Ray actor builds and runs.

`EngineSpec` says what a worker builds (engine name, its config, the model source); `build_engine`
builds it from the engine registry (usable in-process too); `EngineActor` runs it on the actor's
own event loop. The proxy (proxy.py) wraps `EngineActor` with `ray.remote`, one per bundle, and
calls only the methods below: `start`, `submit`, `abort`, `mark_critical`, `update_weights`,
`poll` (outputs, stats and timings together: the heartbeat, a `PollAnswer`), `stop`. This module
does not import ray: an actor is a plain object that Ray hosts, and tests run it in-process.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

from jaxrl_async.engines.base import EngineStats, EngineTiming, GenerationEngine, GenerationRequest, SampleOutput
from planner.configs import check


@dataclass(frozen=True)
class PollAnswer:
    """What one poll brings the proxy (the worker's heartbeat).

    Attributes:
      outputs: the engine's pieces since the last poll, in the order it delivered them.
      stats: the engine's stats at the answer.
      timings: the engine's timed work since the last poll (`GenerationEngine.timings()`: decode
        iterations with their drafted and accepted tokens, weight loads), stamped with this
        worker's `time.monotonic()`.
      clock: this worker's `time.monotonic()` at the answer: the proxy moves `timings` onto its
        own clock with it (a monotonic clock on another node has another origin).
    """

    outputs: list[SampleOutput]
    stats: EngineStats
    timings: list[EngineTiming]
    clock: float


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

    async def mark_critical(self, request_id: str) -> None:
        """The planner marked the request critical: this worker's engine speculates its samples
        (`engine.speculation.when=critical`); an engine that cannot, ignores it."""
        await self.engine.mark_critical(request_id)

    async def update_weights(self, params: Any, version: int) -> None:
        await self.engine.update_weights(params, version)

    async def stats(self) -> EngineStats:
        return await self.engine.stats()

    async def poll(self, timeout: float) -> PollAnswer:
        """The outputs since the last poll (waits up to `timeout` s for the first one), the
        engine's stats and its timings: the heartbeat carries them, so the proxy never asks a
        worker for stats, and a run under Ray traces (and counts drafts) as one in-process does."""
        if not self._pending and self._error is None:
            try:
                await asyncio.wait_for(self._ready.wait(), timeout)
            except asyncio.TimeoutError:
                pass
        if self._error is not None:
            raise self._error
        out, self._pending = self._pending, []
        self._ready.clear()
        return PollAnswer(out, await self.engine.stats(), self.engine.timings(), time.monotonic())

    async def stop(self) -> None:
        await self.engine.stop()
