"""What a request's unfinished samples carry when they move between engine replicas.

Straggler migration (`Decision.migrate`, `GenerationEngine.migrate`) moves a running request's
unfinished samples, generated prefix kept, from one replica to a less loaded one: the source
`detach`es them (their undelivered tokens are streamed first, so the output stream stays
complete), the target `attach`es them (prefills prompt + prefix and samples on at the same token
index). `MovedRequest` is the whole state that travels; it is backend-neutral, so any engine
that can re-prefill a prefix can be a `Migratable` replica.

Exactness: sampling keys depend on (seed, sample index, token index) only (`SamplingParams.seed`),
and the request travels with the seed its source drew, so with the same weights a moved sample
draws exactly the tokens it would have drawn unmoved. The prefix's tokens keep the versions they
were sampled on (they were delivered by the source); new tokens carry the target's version.

To make another backend migratable: implement `detach` / `attach` with these semantics;
`ReplicatedEngine.migrate` (engines/replicated.py) routes the move.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from jaxrl_async.engines.base import GenerationRequest


@dataclass(frozen=True)
class MovedSample:
    """One unfinished sample: its index in the request and every token generated so far (already
    delivered, with their versions, by the source). Its next token has index len(token_ids)."""

    sample_index: int
    token_ids: tuple[int, ...]

    @property
    def next_token_index(self) -> int:
        return len(self.token_ids)


@dataclass(frozen=True)
class MovedRequest:
    """A request's unfinished samples in transit. `request` carries the seed the source used
    (drawn by the source when the submitter gave none), so the keys stay the same."""

    request: GenerationRequest
    samples: tuple[MovedSample, ...]

    @property
    def request_id(self) -> str:
        return self.request.request_id


@runtime_checkable
class Migratable(Protocol):
    """An engine replica whose unfinished samples can leave and arrive (`JaxEngine`)."""

    async def detach(self, request_id: str) -> MovedRequest | None:
        """Take the request's unfinished samples out (queued, waiting or decoding), after
        delivering their pending pieces on this engine's stream; None when it holds none of them
        (unknown, finished) or cannot move them."""

    async def attach(self, moved: MovedRequest) -> None:
        """Continue the moved samples here under the same request id; each sample still ends
        with exactly one done piece (an abort included)."""
