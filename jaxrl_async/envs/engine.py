"""`EpisodeEngine`: each sample of a request is an episode, played over a real engine.

The runtime submits a group's request as always (one request, n samples, the planner's start
barrier and priority). A request that carries its task prompt (`GenerationRequest.episode_of`)
becomes n episodes: each calls `generate(token_ids)` once a model turn (the `TurnClient` of
envs/episode.py), and every turn is a request of its own to the inner engine, under the id
`"<request>/<sample>/<turn>"`, with one sample, the episode's tokens so far as its prompt and the
request's sampling keys. A turn therefore samples on the weights the engine holds when it starts:
a turn that starts after a weight update samples on the newer weights, and every token carries
its version as the inner engine stamped it.

What the runtime reads is one sample's stream, as for a single-turn request: the turn's tokens as
they are sampled (versions, log-probs), and before each turn the environment's tokens since the
last one, as a piece with `sampled=False` (no versions: never trained). The done piece carries the
episode's `EpisodeRecord`: its result (reward, rubric terms, messages) or the fault that ended it,
and per-turn timing. The sample's tokens are exactly the sequence the episode sent: a `generate`
call whose tokens do not extend what the episode sent before is a `prefix_mismatch` fault, so
training sees the sampled tokens, never a re-tokenization of them.

Requests without a task prompt (the held-out evaluation of a single-turn task) pass straight to
the inner engine. Migration is not offered: an episode's turns are short requests of their own,
placed by the inner engine (least loaded replica) as each starts.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
import zlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from jaxrl_async.engines.base import (GenerationEngine, GenerationRequest, SampleOutput, read_outputs,
                                      EngineStats, EngineTiming, END_OF_OUTPUTS)
from jaxrl_async.envs.episode import EpisodeFault, EpisodeRecord, Turn
from jaxrl_async.envs.task import EpisodeContext, EpisodeTask
from planner.versions import extend_runs

log = logging.getLogger(__name__)


def turn_seed(seed: int | None, sample: int, turn: int) -> int | None:
    """The sampling seed of one turn: reproducible from the request's seed, distinct per sample and turn."""
    return None if seed is None else zlib.crc32(f"{seed}:{sample}:{turn}".encode())


@dataclass
class _TurnWait:
    """One turn at the inner engine: its pieces so far and the future its episode awaits."""

    episode: _Episode
    future: asyncio.Future
    submitted: float
    first: float | None = None
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[list[int]] = field(default_factory=list)


@dataclass
class _Episode:
    """One sample of an episode request: the tokens it sent and sampled, and its record."""

    request: GenerationRequest
    sample: int
    tokens: list[int]  # prompt + everything since, as the episode sent and sampled it
    record: EpisodeRecord = field(default_factory=EpisodeRecord)
    turn_rid: str | None = None  # the turn at the inner engine now
    turn_ended: float | None = None  # when the last turn returned: the environment's time runs from there
    task: asyncio.Task | None = None
    done: bool = False


class _Client:
    """The `TurnClient` of one episode (envs/episode.py)."""

    def __init__(self, engine: EpisodeEngine, episode: _Episode) -> None:
        self.engine, self.episode = engine, episode

    async def generate(self, token_ids: list[int], *, max_new_tokens: int | None = None) -> Turn:
        return await self.engine._turn(self.episode, list(token_ids), max_new_tokens)


class EpisodeEngine(GenerationEngine):
    """Plays episode requests over `inner` (module docstring); every other request passes through.

    `max_len`: the inner engine's context (`engine.max_len`): a turn samples at most what is left
    of it. `stop_token_ids`: the model's stop tokens (what closes a turn in the chat template).
    """

    def __init__(self, inner: GenerationEngine, task: EpisodeTask, ctx: EpisodeContext, *, max_len: int,
                 max_len_key: str = "engine.max_len") -> None:
        self.inner, self.task, self.ctx = inner, task, ctx
        self.max_len, self.max_len_key = max_len, max_len_key
        self._queue: asyncio.Queue = asyncio.Queue()
        self._episodes: dict[str, list[_Episode]] = {}  # outer request id -> its episodes
        self._turns: dict[str, _TurnWait] = {}  # inner turn id -> the turn
        self._reader: asyncio.Task | None = None

    # ------------------------------------------------------------------ the engine contract
    async def start(self) -> None:
        await self.inner.start()
        self._reader = asyncio.get_running_loop().create_task(self._read_inner())

    async def stop(self) -> None:
        for episodes in list(self._episodes.values()):
            for e in episodes:
                if e.task is not None:
                    e.task.cancel()
        await self.inner.stop()
        if self._reader is not None:
            await asyncio.gather(self._reader, return_exceptions=True)
        self._queue.put_nowait(END_OF_OUTPUTS)

    async def submit(self, request: GenerationRequest) -> None:
        if request.episode_of is None:
            await self.inner.submit(request)
            return
        if request.request_id in self._episodes:
            raise ValueError(f"request {request.request_id!r}: request_id is already queued or running")
        episodes = [_Episode(request, i, list(request.prompt_ids)) for i in range(request.sampling.n)]
        self._episodes[request.request_id] = episodes
        loop = asyncio.get_running_loop()
        for e in episodes:
            e.task = loop.create_task(self._play(e))

    async def abort(self, request_id: str) -> None:
        episodes = self._episodes.get(request_id)
        if episodes is None:
            await self.inner.abort(request_id)
            return
        for e in episodes:
            if e.task is not None and not e.done:
                e.task.cancel()

    async def update_weights(self, params: Any, version: int) -> None:
        await self.inner.update_weights(params, version)

    def outputs(self) -> AsyncIterator[SampleOutput]:
        return read_outputs(self._queue)

    async def stats(self) -> EngineStats:
        stats = await self.inner.stats()
        playing = sum(not e.done for episodes in self._episodes.values() for e in episodes)
        return dataclasses.replace(stats, extra={**stats.extra, "episodes_playing": playing})

    def timings(self) -> list[EngineTiming]:
        return self.inner.timings()

    def worker_of(self, request_id: str) -> int:
        episodes = self._episodes.get(request_id)
        if episodes is None:
            return self.inner.worker_of(request_id)
        live = next((e.turn_rid for e in episodes if e.turn_rid is not None), None)
        return 0 if live is None else self.inner.worker_of(live)

    async def mark_critical(self, request_id: str) -> None:
        episodes = self._episodes.get(request_id)
        if episodes is None:
            await self.inner.mark_critical(request_id)
            return
        for e in episodes:
            if e.turn_rid is not None:
                await self.inner.mark_critical(e.turn_rid)

    def __getattr__(self, name: str) -> Any:
        """What the runtime asks of its engine beyond the contract (limits, replicas) is the inner engine's."""
        return getattr(self.inner, name)

    # ------------------------------------------------------------------ episodes
    async def _play(self, e: _Episode) -> None:
        """Play episode `e` to its end and send its done piece (exactly one, whatever happens)."""
        reason = "stop"
        try:
            e.record.result = await self.task.run_episode(e.request.episode_of, _Client(self, e), self.ctx)
        except EpisodeFault as fault:
            e.record.fault, e.record.fault_kind = str(fault), fault.kind
        except asyncio.CancelledError:
            reason = "abort"
        except Exception as error:  # the task's or the library's code: the episode's fault, said in one line
            e.record.fault, e.record.fault_kind = f"env_error: {type(error).__name__}: {error}", "env_error"
        finally:
            if e.turn_rid is not None:  # an aborted or faulted episode leaves no turn behind
                rid, e.turn_rid = e.turn_rid, None
                self._turns.pop(rid, None)
                await self.inner.abort(rid)
            if e.record.turns and e.turn_ended is not None:
                e.record.turns[-1][2] = time.monotonic() - e.turn_ended  # scoring is the environment's time too
            e.done = True
            self._queue.put_nowait(SampleOutput(e.request.request_id, e.sample, [], [], [], reason, True,
                                                episode=e.record))
            episodes = self._episodes.get(e.request.request_id)
            if episodes is not None and all(x.done for x in episodes):
                del self._episodes[e.request.request_id]

    async def _turn(self, e: _Episode, token_ids: list[int], max_new_tokens: int | None) -> Turn:
        """One model turn of episode `e` continuing `token_ids` (the TurnClient's `generate`)."""
        now = time.monotonic()
        if e.record.turns and e.turn_ended is not None:
            e.record.turns[-1][2] = now - e.turn_ended
        known = len(e.tokens)
        if token_ids[:known] != e.tokens:
            at = next((i for i, (a, b) in enumerate(zip(token_ids, e.tokens)) if a != b), min(known, len(token_ids)))
            raise EpisodeFault("prefix_mismatch", f"turn {len(e.record.turns)} sends tokens that differ from the "
                                                  f"episode's at position {at} (re-tokenized text)")
        added = token_ids[known:]
        if added:
            e.tokens += added
            self._queue.put_nowait(SampleOutput(e.request.request_id, e.sample, added, [0.0] * len(added), [],
                                                sampled=False))
        sampling = e.request.sampling
        room = self.max_len - len(e.tokens)
        limit = min(max_new_tokens or sampling.max_new_tokens, sampling.max_new_tokens, room)
        if limit < 1:
            raise EpisodeFault("too_long", f"the episode's {len(e.tokens)} tokens fill {self.max_len_key}="
                                           f"{self.max_len}: no room for turn {len(e.record.turns)}")
        index = len(e.record.turns)
        rid = f"{e.request.request_id}/{e.sample}/{index}"
        request = GenerationRequest(rid, list(e.tokens), dataclasses.replace(
            sampling, n=1, max_new_tokens=limit, seed=turn_seed(sampling.seed, e.sample, index)), e.request.priority)
        wait = _TurnWait(e, asyncio.get_running_loop().create_future(), now)
        self._turns[rid] = wait
        e.turn_rid = rid
        e.record.turns.append([0.0, 0.0, 0.0])
        e.record.turn_tokens.append(0)
        await self.inner.submit(request)
        turn = await wait.future
        e.turn_rid = None
        e.turn_ended = time.monotonic()
        e.record.turns[-1][:2] = [turn.queued_s, turn.gen_s]
        e.record.turn_tokens[-1] = len(turn.token_ids)
        e.tokens += turn.token_ids
        if turn.finish_reason == "abort":
            raise asyncio.CancelledError  # the inner engine gave the turn up: the episode ends as aborted
        return turn

    async def _read_inner(self) -> None:
        """Route the inner engine's pieces: a turn's to its episode's stream and future, the rest through."""
        try:
            async for piece in self.inner.outputs():
                wait = self._turns.get(piece.request_id)
                if wait is None:
                    if "/" not in piece.request_id:  # a passed-through request; a gone turn's late piece is dropped
                        self._queue.put_nowait(piece)
                    continue
                e, now = wait.episode, time.monotonic()
                if wait.first is None and piece.token_ids:
                    wait.first = now
                wait.token_ids += piece.token_ids
                wait.logprobs += piece.logprobs
                extend_runs(wait.versions, piece.versions)
                if piece.token_ids:
                    self._queue.put_nowait(SampleOutput(e.request.request_id, e.sample, list(piece.token_ids),
                                                        list(piece.logprobs), [list(r) for r in piece.versions]))
                if piece.done:
                    del self._turns[piece.request_id]
                    first = wait.first if wait.first is not None else now
                    turn = Turn(wait.token_ids, wait.logprobs, wait.versions, piece.finish_reason or "stop",
                                first - wait.submitted, now - first)
                    if not wait.future.done():
                        wait.future.set_result(turn)
        except Exception as error:  # a dead inner engine: the runtime's stream raises it
            self._queue.put_nowait(error)


def play_episodes(engine: GenerationEngine, task: EpisodeTask, ctx: EpisodeContext, engine_cfg: Any) -> EpisodeEngine:
    """`engine` behind an EpisodeEngine for `task`, its context limit read from the engine's config
    (`engine.max_len`, or vLLM's `engine.max_model_len`)."""
    for key in ("max_len", "max_model_len"):
        if getattr(engine_cfg, key, None) is not None:
            return EpisodeEngine(engine, task, ctx, max_len=int(getattr(engine_cfg, key)), max_len_key=f"engine.{key}")
    raise ValueError(f"task {task.name!r} is multi-turn but the engine config states no context length "
                     "(engine.max_len or engine.max_model_len)")
