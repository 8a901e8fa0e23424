"""The generation-engine contract shared by every backend (native JAX, vLLM).

The async runtime talks to an engine only through `GenerationEngine`: it submits
`GenerationRequest`s, reads `SampleOutput`s from one async stream, aborts requests, and pushes
new weights. Every sampled token carries the log-prob the behaviour policy gave it and the
weight version that sampled it, because the trainer's off-policy correction and the staleness
ledger (docs/design.md §1 and §8) need both.

To add a backend: subclass `GenerationEngine` in `engines/<name>/engine.py`, keep every
docstring promise below (each sample ends with exactly one `done=True` output, versions are
per token, log-probs are at temperature 1), and run the engine tests against it.
"""

from __future__ import annotations

import abc
import asyncio
import math
from collections.abc import AsyncIterator, Container, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from planner.configs import check
from planner.versions import join_runs

FinishReason = Literal["stop", "length", "abort"]


@dataclass(frozen=True)
class SamplingParams:
    """How to sample one request's continuations.

    Attributes:
      max_new_tokens: most tokens generated per sample (the stop token included); reaching it
        ends the sample with finish_reason "length".
      temperature: softmax temperature; 0 means greedy (argmax of the raw logits).
      top_p: nucleus sampling; keep the smallest set of most likely tokens whose probability
        (after temperature) reaches top_p. 1.0 disables it.
      top_k: keep only the k most likely tokens; 0 disables it.
      stop_token_ids: sampling one of these ends the sample with finish_reason "stop"; the stop
        token itself is part of `token_ids` (the trainer needs its log-prob).
      n: number of samples (a GRPO group) drawn from one prompt; the prompt is prefilled once.
      seed: makes the samples reproducible: sample i's t-th token depends only on (seed, i, t),
        the weights and the prefix, never on which slot or batch it ran in. None: the engine
        draws one.
    """

    max_new_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    stop_token_ids: tuple[int, ...] = ()
    n: int = 1
    seed: int | None = None

    def __post_init__(self) -> None:
        p = "SamplingParams"
        check(isinstance(self.max_new_tokens, int) and self.max_new_tokens >= 1, f"{p}.max_new_tokens",
              self.max_new_tokens, "must be an int >= 1")
        check(math.isfinite(self.temperature) and self.temperature >= 0, f"{p}.temperature", self.temperature,
              "must be >= 0 (0 = greedy)")
        check(0 < self.top_p <= 1, f"{p}.top_p", self.top_p, "must be in (0, 1]")
        check(isinstance(self.top_k, int) and self.top_k >= 0, f"{p}.top_k", self.top_k, "must be an int >= 0 (0 = off)")
        check(isinstance(self.n, int) and self.n >= 1, f"{p}.n", self.n, "must be an int >= 1")
        check(self.seed is None or 0 <= self.seed < 2**32, f"{p}.seed", self.seed, "must be None or in [0, 2**32)")
        object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in self.stop_token_ids))


@dataclass(frozen=True)
class GenerationRequest:
    """One prompt to continue `sampling.n` times.

    Attributes:
      request_id: unique among the requests the engine still holds (queued or running); the
        outputs and `abort` refer to it.
      prompt_ids: the prompt's token ids (chat template already applied), at least one.
      sampling: how to sample.
      priority: when the engine has more requests than free slots, the lowest value is admitted
        first; ties go in submit order. The runtime passes the group's deadline (docs/design.md §2).
    """

    request_id: str
    prompt_ids: list[int]
    sampling: SamplingParams
    priority: float = 0.0
    episode_of: Any = None

    def __post_init__(self) -> None:
        if not self.prompt_ids:
            raise ValueError(f"request {self.request_id!r}: prompt_ids is empty; need at least one token")


def check_new_request_id(request_id: str, live: Container[str]) -> None:
    """Raise a one-line ValueError when `request_id` is among the engine's `live` requests
    (queued or running): outputs and `abort` refer to a request by its id."""
    if request_id in live:
        raise ValueError(f"request {request_id!r}: request_id is already queued or running")


@dataclass(frozen=True)
class RequestLimits:
    """What one engine can ever run, with the config key that sets each limit (for the message).

    Every backend states its limits once (`JaxEngine`: max_len, num_slots; vLLM: max_model_len,
    max_num_seqs) and `check` applies the one rule, so both refuse the same requests the same way.

    Attributes:
      context: most positions of one sample: prompt + max_new_tokens must fit.
      context_key: the key that sets `context`, e.g. "engine.max_len".
      samples: most samples of one request (they are decoded together).
      samples_key: the key that sets `samples`, e.g. "engine.num_slots".
      vocab_size: prompt token ids must be in [0, vocab_size).
    """

    context: int
    context_key: str
    samples: int
    samples_key: str
    vocab_size: int

    def check(self, request: GenerationRequest) -> None:
        """Raise a one-line ValueError naming the request when it can never run on this engine
        (reads only the limits, so any thread may call it)."""
        rid, sp = request.request_id, request.sampling
        prompt = len(request.prompt_ids)
        need = prompt + sp.max_new_tokens
        if need > self.context:
            raise ValueError(f"request {rid!r}: prompt of {prompt} tokens + max_new_tokens={sp.max_new_tokens} "
                             f"= {need} exceeds {self.context_key}={self.context}")
        if sp.n > self.samples:
            raise ValueError(f"request {rid!r}: n={sp.n} exceeds {self.samples_key}={self.samples}")
        bad = next((t for t in request.prompt_ids if not 0 <= t < self.vocab_size), None)
        if bad is not None:
            raise ValueError(f"request {rid!r}: prompt token id {bad} is outside the vocabulary [0, {self.vocab_size})")


@dataclass(frozen=True)
class SampleOutput:
    """A piece of one sample's continuation, streamed as it is generated.

    Outputs are deltas: the pieces of one (request_id, sample_index), concatenated in arrival
    order (`join_outputs`), are the whole continuation. Every sample of every submitted request
    ends with exactly one output with `done=True`, aborted ones included.

    Attributes:
      request_id: the request this sample belongs to.
      sample_index: which of the request's `n` samples, in [0, n).
      token_ids: the new tokens of this piece (not the prompt); may be empty on the final piece.
      logprobs: per token of `token_ids`, log p(token) under the behaviour policy's model
        distribution: log-softmax of the raw logits (temperature 1, before top-p/top-k), float32
        precision. This is the quantity the importance ratio of RL off-policy correction needs;
        it is not the log-prob under the tempered/truncated sampling distribution.
      versions: the weight version that sampled each token of `token_ids`, run-length encoded
        as [[version, count], ...] with counts summing to len(token_ids) (`planner.versions`'s
        run helpers keep them). With partial rollout a sample can span several versions.
      finish_reason: "stop" (a stop token was sampled), "length" (max_new_tokens reached) or
        "abort"; None until done.
      done: True on the last piece of this sample.
      sampled: False for an episode's environment tokens (envs/engine.py): the model did not
        sample them and they are never trained; `logprobs` are 0.0 and `versions` is [] then.
      episode: on the done piece of an episode, its `EpisodeRecord` (envs/episode.py): the
        result or fault, per-turn timing and tokens.
    """

    request_id: str
    sample_index: int
    token_ids: list[int]
    logprobs: list[float]
    versions: list[list[int]]
    finish_reason: FinishReason | None = None
    done: bool = False
    sampled: bool = True
    episode: Any = None


def join_outputs(pieces: Iterable[SampleOutput]) -> SampleOutput:
    """Concatenate the streamed pieces of one sample (in arrival order) into one output."""
    pieces = list(pieces)
    if not pieces:
        raise ValueError("join_outputs: no pieces given")
    keys = {(p.request_id, p.sample_index) for p in pieces}
    if len(keys) != 1:
        raise ValueError(f"join_outputs: pieces of several samples {sorted(keys)}; join one sample at a time")
    last = pieces[-1]
    return SampleOutput(
        request_id=last.request_id, sample_index=last.sample_index,
        token_ids=[t for p in pieces for t in p.token_ids],
        logprobs=[x for p in pieces for x in p.logprobs],
        versions=join_runs(p.versions for p in pieces), finish_reason=last.finish_reason, done=last.done)


@dataclass(frozen=True)
class EngineStats:
    """A snapshot of an engine's load (the planner's adaptive caps read it).

    Attributes:
      active_slots: sequences being decoded now.
      total_slots: most sequences decoded at once.
      queued: requests submitted but not admitted yet.
      busy_fraction: fraction of wall time since start spent generating (prefill + decode).
      version: the weight version used for new tokens.
    """

    active_slots: int
    total_slots: int
    queued: int
    busy_fraction: float
    version: int
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class EngineTiming:
    """One timed piece of engine work, for the run's timing trace (docs/calibration.md).

    Attributes:
      kind: "decode" (one engine iteration: admission, prefill, decode steps) or "load" (new
        weights took effect).
      worker: the replica (or worker) index within the engine; 0 for a single engine.
      t: `time.monotonic()` when the work began.
      seconds: how long it took.
      steps: decode steps in the iteration (every active sequence advances one token a step).
      tokens: tokens the iteration produced (steps × mean active sequences).
      prefill_tokens: prompt tokens prefilled in the iteration.
      version: the weights loaded ("load").
      compiled: the iteration compiled a step first (its time is not the step's cost).
      drafted: speculative decoding: tokens drafted in the iteration (0 without speculation).
      accepted: of those, the tokens the verification kept (accepted / drafted is the
        acceptance rate `planner.calibrate` fits).
      speculating: sequences that drafted in the iteration (0 without speculation); summed
        over a run it says whether speculation acted at all.
    """

    kind: Literal["decode", "load"]
    worker: int
    t: float
    seconds: float
    steps: int = 0
    tokens: int = 0
    prefill_tokens: int = 0
    version: int = 0
    compiled: bool = False
    drafted: int = 0
    accepted: int = 0
    speculating: int = 0


class GenerationEngine(abc.ABC):
    """An async generation backend. All methods are called from one asyncio event loop."""

    # What one request may ask of this engine (the rule `submit` applies), for a caller that
    # checks requests in its own words first (the server, jaxrl_async/serving/); None: the
    # engine does not state them (one that fronts other engines).
    limits: RequestLimits | None = None

    @abc.abstractmethod
    async def start(self) -> None:
        """Start generating; requests submitted before `start` wait in the queue."""

    @abc.abstractmethod
    async def stop(self) -> None:
        """Stop generating and end the `outputs()` stream. In-flight samples are not finished."""

    @abc.abstractmethod
    async def submit(self, request: GenerationRequest) -> None:
        """Queue a request. Raises ValueError at once (naming the request id) when it can never
        run: duplicate id (`check_new_request_id`), prompt + max_new_tokens longer than the
        context, n > slots, a token outside the vocabulary (`RequestLimits.check`)."""

    @abc.abstractmethod
    async def abort(self, request_id: str) -> None:
        """End a request's unfinished samples with finish_reason "abort" (tokens generated so far
        are delivered). An unknown or already finished id is ignored: aborts race with
        completion."""

    @abc.abstractmethod
    async def update_weights(self, params: Any, version: int) -> None:
        """Use new weights for every token sampled after the swap; returns once they are in use.

        The params must have the engine's tree structure, shapes and dtypes (ValueError naming
        the first leaf that differs). `version` must not go backwards. Whether in-flight samples
        continue across the swap (partial rollout) or finish first (drain) is the engine's
        sync mode.
        """

    @abc.abstractmethod
    def outputs(self) -> AsyncIterator[SampleOutput]:
        """The single stream of `SampleOutput`s of all requests; ends after `stop()`."""

    @abc.abstractmethod
    async def stats(self) -> EngineStats:
        """A snapshot of the engine's load."""

    def timings(self) -> list[EngineTiming]:
        """The work timed since the last call, oldest first (the run's timing trace). An engine
        that cannot time its iterations (vLLM's own processes) returns []."""
        return []

    def worker_of(self, request_id: str) -> int:
        """The replica (or worker) index that holds the request; 0 for a single engine."""
        return 0

    async def mark_critical(self, request_id: str) -> None:
        """The planner marks the request deadline-critical (`Decision.critical`): an engine with
        `speculation.when=critical` speculates its unfinished samples from now on. An engine
        that cannot speculate, or an unknown or finished id, ignores it."""

    async def migrate(self, request_id: str) -> tuple[int, int] | None:
        """Move the request's unfinished samples, generated prefix kept, to a less loaded
        replica (`Decision.migrate`): the target prefills prompt + prefix and continues; every
        token keeps its version and the output stream goes on under the same request id.
        Returns (from, to) replica indices, or None when nothing moved (one replica, none less
        loaded, an unknown or finished id)."""
        return None


def least_loaded(loads: Mapping[int, int]) -> int:
    """The index (of a replica, a worker) with the smallest load; ties go to the lowest index.

    The one routing rule of every engine that fronts several (`ReplicatedEngine`,
    `RayEngineProxy`): deterministic, so a recorded run routes the same way again.
    """
    if not loads:
        raise ValueError("least_loaded: loads is empty; need at least one replica")
    return min(loads, key=lambda index: (loads[index], index))


END_OF_OUTPUTS = object()  # put on an engine's output queue by stop(): the stream ends there


async def read_outputs(queue: asyncio.Queue) -> AsyncIterator[SampleOutput]:
    """The `outputs()` stream of an engine that puts its pieces on `queue`: yields them until
    `END_OF_OUTPUTS`, raising any exception put there instead (a dead engine). The end marker is
    put back, so any later reader ends too."""
    while True:
        item = await queue.get()
        if item is END_OF_OUTPUTS:
            queue.put_nowait(END_OF_OUTPUTS)
            return
        if isinstance(item, BaseException):
            raise item
        yield item
