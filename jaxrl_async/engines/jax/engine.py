"""The native JAX generation engine for the async runtime: `EngineCore` in a worker thread.

The event loop never runs device work. Its methods put typed commands (`Submit`, `Abort`,
`Detach`, `Attach`, `MarkCritical`, `NewWeights`: frozen dataclasses, one per call) on a
thread-safe deque; the worker thread applies them between two `EngineCore.step()` calls —
so weights always swap between decode steps — and hands the outputs back to the loop with
`call_soon_threadsafe`. Migration (`detach` / `attach`, engines/migration.py) goes the same way:
a detach's pieces reach the output queue before its result reaches the caller. All bookkeeping
the loop reads (live request ids, output queue, weight waiters) lives in the loop thread; the
worker only touches the core. `make_core` builds the core a config asks for (core.py's
`EngineCore`, or paged.py's `PagedEngineCore` when `engine.page_size` > 0).

To add an engine call: a frozen dataclass below and a case in `_apply`.

Request checks that need no engine state (context length, n, vocabulary) and the weight check
(structure, shapes, dtypes) run in the caller, so errors surface at `submit` / `update_weights`.
"""

from __future__ import annotations

import asyncio
import collections
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from flax import nnx
from jax.sharding import Mesh

from jaxrl_async.engines.base import (END_OF_OUTPUTS, EngineStats, EngineTiming, GenerationEngine,
                                      GenerationRequest, RequestLimits, SampleOutput, check_new_request_id,
                                      read_outputs)
from jaxrl_async.engines.jax.compiles import COMPILE_COUNTS
from jaxrl_async.engines.jax.config import EngineConfig
from jaxrl_async.engines.jax.core import EngineCore
from jaxrl_async.engines.jax.paged import PagedEngineCore
from jaxrl_async.engines.migration import MovedRequest
from jaxrl_async.models.config import ModelConfig


def make_core(model: nnx.Module, model_config: ModelConfig, config: EngineConfig, version: int = 0,
              mesh: Mesh | None = None) -> EngineCore:
    """The engine core `config` asks for: `EngineCore` (page_size 0) or `PagedEngineCore`."""
    core = EngineCore if config.page_size == 0 else PagedEngineCore
    return core(model, model_config, config, version, mesh)


@dataclass(frozen=True)
class Submit:
    """Queue `request` on the core (checked already, in the loop thread)."""

    request: GenerationRequest


@dataclass(frozen=True)
class Abort:
    """End `request_id`'s unfinished samples (their pieces go out as "abort")."""

    request_id: str


@dataclass(frozen=True)
class Detach:
    """Take `request_id`'s unfinished samples out; `done` (a loop-thread future) gets the
    `MovedRequest` after the pieces they still had to deliver."""

    request_id: str
    done: asyncio.Future


@dataclass(frozen=True)
class Attach:
    """Continue a `MovedRequest`'s samples on this core (counted in `_live` already)."""

    moved: MovedRequest


@dataclass(frozen=True)
class MarkCritical:
    """`request_id`'s samples draft from now on (engine.speculation.when=critical)."""

    request_id: str


@dataclass(frozen=True)
class NewWeights:
    """Install `weights` (already checked and copied by `check_params`) as `version`; `done`
    gets a version going backwards as its error."""

    weights: dict
    version: int
    done: asyncio.Future


EngineCommand = Submit | Abort | Detach | Attach | MarkCritical | NewWeights


class JaxEngine(GenerationEngine):
    """Continuous-batching JAX engine (see core.py for the scheduling, engines/base.py for the contract).

    `mesh`: the devices of this engine (None: the model's device); see `EngineCore`.
    """

    def __init__(self, model: nnx.Module, model_config: ModelConfig, config: EngineConfig,
                 version: int = 0, mesh: Mesh | None = None):
        self.core = make_core(model, model_config, config, version, mesh)
        self._commands: collections.deque[EngineCommand] = collections.deque()
        self._wake = threading.Condition()
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._out: asyncio.Queue = asyncio.Queue()
        self._live: dict[str, int] = {}  # loop thread: request id -> samples not yet done
        self._weight_waiters: list[tuple[int, asyncio.Future]] = []  # loop thread
        self._detach_waiters: set[asyncio.Future] = set()  # loop thread: detaches not answered yet
        self._busy_s = 0.0
        self._started_at = 0.0
        self._error: BaseException | None = None  # set when the worker thread died
        # Worker thread appends, loop thread drains (`timings`): deque appends and pops are atomic.
        self._timings: collections.deque[EngineTiming] = collections.deque()

    @property
    def limits(self) -> RequestLimits:
        return self.core.limits

    # ------------------------------------------------------------ event-loop side

    async def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError("JaxEngine.start: already started")
        self._loop = asyncio.get_running_loop()
        self._started_at = time.perf_counter()
        self._thread = threading.Thread(target=self._run, name="jax-engine", daemon=True)
        self._thread.start()

    async def stop(self) -> None:
        with self._wake:
            self._stopping = True
            self._wake.notify()
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join)
        for _, fut in self._weight_waiters:
            if not fut.done():
                fut.set_exception(RuntimeError("JaxEngine stopped before the new weights were in use"))
        self._weight_waiters = []
        self._fail_detaches(RuntimeError("JaxEngine stopped before a migration's detach was answered"))
        self._out.put_nowait(END_OF_OUTPUTS)

    async def submit(self, request: GenerationRequest) -> None:
        self._raise_if_failed()
        check_new_request_id(request.request_id, self._live)
        self.core.check_request(request)
        self._live[request.request_id] = request.sampling.n
        self._send(Submit(request))

    async def abort(self, request_id: str) -> None:
        if request_id in self._live:
            self._send(Abort(request_id))

    async def detach(self, request_id: str) -> MovedRequest | None:
        """`Migratable.detach`: the request's unfinished samples leave this engine (their pending
        pieces are on the output queue when this returns); None when none are here or the core
        cannot migrate (a paged core, "drain" sync mode)."""
        self._raise_if_failed()
        if request_id not in self._live or not self.core.migratable:
            return None
        done = asyncio.get_running_loop().create_future()
        self._detach_waiters.add(done)
        self._send(Detach(request_id, done))
        try:
            return await done
        finally:
            self._detach_waiters.discard(done)

    async def attach(self, moved: MovedRequest) -> None:
        """`Migratable.attach`: continue the moved samples here (ValueError at once for a request
        id this engine already holds)."""
        self._raise_if_failed()
        check_new_request_id(moved.request_id, self._live)
        self._live[moved.request_id] = len(moved.samples)
        self._send(Attach(moved))

    async def mark_critical(self, request_id: str) -> None:
        if request_id in self._live:
            self._send(MarkCritical(request_id))

    async def update_weights(self, params: Any, version: int) -> None:
        self._raise_if_failed()
        # Checked and copied in the caller, before anything else is awaited: commands reach the
        # worker in call order, so a request submitted after this call waits for the swap.
        state = self.core.check_params(params)
        done = asyncio.get_running_loop().create_future()
        self._weight_waiters.append((version, done))
        self._send(NewWeights(state, version, done))
        await done

    def outputs(self) -> AsyncIterator[SampleOutput]:
        return read_outputs(self._out)

    async def stats(self) -> EngineStats:
        elapsed = time.perf_counter() - self._started_at if self._thread else 0.0
        core = self.core
        return EngineStats(
            active_slots=core.active_slots, total_slots=core.config.num_slots,
            queued=core.queued + sum(isinstance(c, Submit) for c in list(self._commands)),
            busy_fraction=self._busy_s / elapsed if elapsed > 0 else 0.0,
            version=core.version, extra={"counters": dict(core.counters),
                                         **({"adapters": core.adapter_versions} if core.adapter_versions else {})})

    def timings(self) -> list[EngineTiming]:
        out = []
        while self._timings:
            out.append(self._timings.popleft())
        return out

    def _raise_if_failed(self) -> None:
        if self._error is not None:
            raise RuntimeError(f"JaxEngine's worker thread died: {self._error!r}") from self._error

    def _send(self, command: EngineCommand) -> None:
        with self._wake:
            self._commands.append(command)
            self._wake.notify()

    def _deliver(self, outputs: list[SampleOutput], version: int) -> None:
        """Loop thread: queue the outputs, forget finished requests, release weight waiters."""
        for out in outputs:
            if out.done:
                self._live[out.request_id] -= 1
                if not self._live[out.request_id]:
                    del self._live[out.request_id]
            self._out.put_nowait(out)
        waiting = []
        for want, fut in self._weight_waiters:
            if fut.done():
                continue
            if want <= version:
                fut.set_result(None)
            else:
                waiting.append((want, fut))
        self._weight_waiters = waiting

    def _detached(self, outputs: list[SampleOutput], moved: MovedRequest | None, done: asyncio.Future) -> None:
        """Loop thread: a detach's pieces go out first, then the moved samples leave `_live`."""
        self._deliver(outputs, self.core.version)
        if moved is not None:
            self._live[moved.request_id] -= len(moved.samples)
            if not self._live[moved.request_id]:
                del self._live[moved.request_id]
        if not done.done():
            done.set_result(moved)

    def _fail(self, error: BaseException) -> None:
        """Loop thread: the worker died; every waiter and the output stream get the error."""
        self._error = error
        for _, fut in self._weight_waiters:
            if not fut.done():
                fut.set_exception(error)
        self._weight_waiters = []
        self._fail_detaches(error)
        self._out.put_nowait(error)

    def _fail_detaches(self, error: BaseException) -> None:
        """Loop thread: a detach the worker will never answer (it died, or stopped) gets `error`,
        so a migration in flight ends instead of waiting forever."""
        for fut in self._detach_waiters:
            if not fut.done():
                fut.set_exception(error)

    # ------------------------------------------------------------ worker thread

    def _run(self) -> None:
        try:
            while True:
                with self._wake:
                    while not (self._commands or self._stopping or self.core.has_work()):
                        self._wake.wait()
                    if self._stopping:
                        return
                    commands = list(self._commands)
                    self._commands.clear()
                version, t_apply = self.core.version, time.monotonic()
                outputs = self._apply(commands)
                start, t_step = time.perf_counter(), time.monotonic()
                if self.core.version != version:  # partial sync: swapped between two iterations
                    self._timings.append(EngineTiming("load", 0, t_apply, t_step - t_apply, version=self.core.version))
                version, before = self.core.version, self._work()
                outputs += self.core.step()
                seconds = time.perf_counter() - start
                self._busy_s += seconds
                self._time_step(t_step, seconds, version, before)
                self._loop.call_soon_threadsafe(self._deliver, outputs, self.core.version)
        except BaseException as error:  # noqa: BLE001 - handed to the loop, re-raised there
            self._loop.call_soon_threadsafe(self._fail, error)

    def _work(self) -> tuple[int, ...]:
        c = self.core.counters
        return (c["decode_steps"], c["tokens"], c["prefill_tokens"], sum(COMPILE_COUNTS.values()), c["drafted"],
                c["accepted"], c["speculating"])

    def _time_step(self, t: float, seconds: float, version: int, before: tuple[int, ...]) -> None:
        """Worker thread: the iteration's timing, and a drain-mode swap it made (at its start)."""
        if self.core.version != version:
            self._timings.append(EngineTiming("load", 0, t, 0.0, version=self.core.version))
        steps, tokens, prefill, compiles, drafted, accepted, speculating = (
            a - b for a, b in zip(self._work(), before))
        if steps or prefill:
            self._timings.append(EngineTiming("decode", 0, t, seconds, steps, tokens, prefill, compiled=compiles > 0,
                                              drafted=drafted, accepted=accepted, speculating=speculating))

    def _apply(self, commands: list[EngineCommand]) -> list[SampleOutput]:
        outputs: list[SampleOutput] = []
        for command in commands:
            match command:
                case Submit(request):
                    self.core.submit(request)
                case Abort(request_id):
                    outputs += self.core.abort(request_id)
                case Detach(request_id, done):
                    moved, pieces = self.core.detach(request_id)
                    # Earlier commands' outputs first: every piece of this request precedes the answer.
                    self._loop.call_soon_threadsafe(self._detached, outputs + pieces, moved, done)
                    outputs = []
                case Attach(moved):
                    self.core.attach(moved)
                case MarkCritical(request_id):
                    self.core.mark_critical(request_id)
                case NewWeights(weights, version, done):
                    try:
                        self.core.install_weights(weights, version)
                    except ValueError as error:  # a version going backwards: the caller's error
                        self._loop.call_soon_threadsafe(done.set_exception, error)
        return outputs
