"""Host-side bookkeeping of the JAX engine: the priority queue and the per-slot sequence state.

Pure Python, no JAX: the engine core asks the queue which requests to admit into free slots and
keeps one `SlotSequence` per occupied slot. Admission is strict priority order: when the head
request needs more slots than are free, later requests wait too (no back-filling), so a
request's place in the queue is never overtaken by a smaller one.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field

from jaxrl_async.engines.base import FinishReason, GenerationRequest, SampleOutput
from planner.versions import VersionRuns, append_run


class RequestQueue:
    """Requests waiting for slots, lowest `priority` first, ties in submit order."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, GenerationRequest]] = []
        self._order = itertools.count()

    def __len__(self) -> int:
        return len(self._heap)

    def __contains__(self, request_id: str) -> bool:
        return any(entry[2].request_id == request_id for entry in self._heap)

    def push(self, request: GenerationRequest) -> None:
        heapq.heappush(self._heap, (request.priority, next(self._order), request))

    def remove(self, request_id: str) -> GenerationRequest | None:
        """Take a queued request out (abort); None when it is not queued."""
        for i, entry in enumerate(self._heap):
            if entry[2].request_id == request_id:
                self._heap.pop(i)
                heapq.heapify(self._heap)
                return entry[2]
        return None

    def pop_admissible(self, free_slots: int) -> list[GenerationRequest]:
        """Pop requests in priority order while the head's `n` samples fit in the free slots."""
        admitted = []
        while self._heap and self._heap[0][2].sampling.n <= free_slots:
            request = heapq.heappop(self._heap)[2]
            free_slots -= request.sampling.n
            admitted.append(request)
        return admitted

    def pop_while(self, take: Callable[[GenerationRequest], bool]) -> list[GenerationRequest]:
        """Pop requests in priority order while `take(head)` says it took the head's resources
        (a paged engine's free slots and pages); the first refusal stops (no back-filling)."""
        admitted = []
        while self._heap and take(self._heap[0][2]):
            admitted.append(heapq.heappop(self._heap)[2])
        return admitted


@dataclass
class SlotSequence:
    """One sample being decoded in a slot.

    `last_token` is fed at `position` in the next decode step; the prompt's last token is fed
    that way too, so the first sampled token comes out of the first decode step. The `pending_*`
    lists hold what was generated but not yet delivered in a `SampleOutput`.
    """

    request_id: str
    sample_index: int
    last_token: int
    position: int
    max_new_tokens: int
    stop_token_ids: frozenset[int]
    generated: int = 0
    token_ids: list[int] = field(default_factory=list)  # every token generated so far (a migration's prefix)
    pending_tokens: list[int] = field(default_factory=list)
    pending_logprobs: list[float] = field(default_factory=list)
    pending_versions: VersionRuns = field(default_factory=list)
    pinned: int | None = None  # the adapter version it runs on (adapter_versions > 1); None: the engine's

    def append(self, token: int, logprob: float, version: int) -> FinishReason | None:
        """Record a sampled token; returns why the sample ends, or None if it goes on."""
        self.token_ids.append(token)
        self.pending_tokens.append(token)
        self.pending_logprobs.append(logprob)
        append_run(self.pending_versions, version)
        self.generated += 1
        self.last_token = token
        self.position += 1
        if token in self.stop_token_ids:
            return "stop"
        if self.generated >= self.max_new_tokens:
            return "length"
        return None

    def flush(self, finish_reason: FinishReason | None = None) -> SampleOutput:
        """Deliver the pending piece (the final one when finish_reason is given)."""
        out = SampleOutput(
            request_id=self.request_id, sample_index=self.sample_index,
            token_ids=self.pending_tokens, logprobs=self.pending_logprobs,
            versions=self.pending_versions, finish_reason=finish_reason,
            done=finish_reason is not None)
        self.pending_tokens, self.pending_logprobs, self.pending_versions = [], [], []
        return out
