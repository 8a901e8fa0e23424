"""`EngineClient`: many concurrent callers over one `GenerationEngine`, each awaiting its own samples.

The engine has one output stream for all requests (engines/base.py), so one reader task reads
it and hands each sample's pieces to the request that owns them; a request's future resolves
when all its `n` samples are done. Request ids are the client's own (`<prefix>-<counter>`), so
callers never collide with each other or with an id the engine still holds. A caller that is
cancelled (an HTTP client that disconnected, a timeout) aborts its request in the engine: the
slot frees at once instead of decoding for nobody. A dead engine (its stream raised) fails every
waiting request and every later one with the engine's error.

No HTTP here: the server (app.py) and the runtime can both drive an engine through it.
To use it: `await client.start()` on the loop that will call it, `await client.generate(...)`
from any task of that loop, `await client.stop()` at the end.
"""

from __future__ import annotations

import asyncio
import itertools
from collections import Counter
from dataclasses import dataclass

from jaxrl_async.engines.base import GenerationEngine, GenerationRequest, SampleOutput, SamplingParams, join_outputs


# What `EngineClient.summary` reports, in this order (each counted once per request).
COUNTS = ("submitted", "finished", "aborted", "refused", "failed")


class EngineStopped(RuntimeError):
    """The engine stopped or died before the request's samples were done."""


@dataclass
class _Waiting:
    """One submitted request: its pieces per sample, until all `n` are done."""

    future: asyncio.Future
    pieces: list[list[SampleOutput]]
    left: int  # samples not done yet

    def add(self, piece: SampleOutput) -> None:
        self.pieces[piece.sample_index].append(piece)
        if piece.done:
            self.left -= 1
            if self.left == 0 and not self.future.done():
                self.future.set_result([join_outputs(p) for p in self.pieces])


class EngineClient:
    """Submit requests to `engine` and await their joined samples (one `SampleOutput` per sample,
    in sample order). `counts` says what it did: requests submitted, finished, aborted by a
    cancelled caller, refused by the engine's checks, failed by a stopped or dead engine."""

    def __init__(self, engine: GenerationEngine, *, prefix: str = "serve") -> None:
        self.engine = engine
        self.prefix = prefix
        self.counts: Counter[str] = Counter()
        self._waiting: dict[str, _Waiting] = {}
        self._ids = itertools.count()
        self._reader: asyncio.Task | None = None
        self._error: BaseException | None = None

    async def start(self) -> None:
        """Start the engine and the reader (on the running loop: the one every call must use)."""
        await self.engine.start()
        self._reader = asyncio.create_task(self._read(), name="engine-client-reader")

    async def stop(self) -> None:
        """Stop the engine; requests still waiting fail with `EngineStopped`."""
        await self.engine.stop()
        if self._reader is not None:
            await self._reader
        self._fail(EngineStopped("the engine stopped before the request was done"))

    @property
    def error(self) -> BaseException | None:
        """Why the engine's stream ended with an error (None while it is healthy)."""
        return self._error

    @property
    def in_flight(self) -> int:
        return len(self._waiting)

    def summary(self) -> dict[str, int]:
        """Every count of `COUNTS` (zeros included) and the requests in flight now."""
        return {**{key: self.counts[key] for key in COUNTS}, "in_flight": self.in_flight}

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams, *,
                       priority: float = 0.0) -> list[SampleOutput]:
        """The request's `sampling.n` samples, joined. Raises ValueError (the engine's one line)
        when the engine can never run it, `EngineStopped` when the engine stops or dies first;
        a cancelled caller aborts the request in the engine."""
        if self._error is not None:
            raise EngineStopped(f"the engine died: {self._error}") from self._error
        request_id = f"{self.prefix}-{next(self._ids)}"
        waiting = _Waiting(asyncio.get_running_loop().create_future(), [[] for _ in range(sampling.n)], sampling.n)
        self._waiting[request_id] = waiting
        try:
            try:
                await self.engine.submit(GenerationRequest(request_id, list(prompt_ids), sampling, priority))
            except ValueError:
                self.counts["refused"] += 1
                raise
            self.counts["submitted"] += 1
            try:
                samples = await waiting.future
            except asyncio.CancelledError:
                self.counts["aborted"] += 1
                await self.engine.abort(request_id)  # the engine's done pieces are dropped by the reader
                raise
            self.counts["finished"] += 1
            return samples
        finally:
            del self._waiting[request_id]

    async def _read(self) -> None:
        try:
            async for piece in self.engine.outputs():
                waiting = self._waiting.get(piece.request_id)
                if waiting is not None:  # None: a request whose caller went away (aborted)
                    waiting.add(piece)
        except Exception as e:  # a dead engine: every waiting caller gets its error
            self._error = e
            self._fail(EngineStopped(f"the engine died: {e}"))

    def _fail(self, error: EngineStopped) -> None:
        for waiting in self._waiting.values():
            if not waiting.future.done():
                self.counts["failed"] += 1
                waiting.future.set_exception(error)
