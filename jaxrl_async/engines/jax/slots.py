"""The engine core's host state, as a small public API: its slots and its live requests.

`EngineCore` (core.py) owns one `Slots` and one `LiveRequests`; its collaborators — migration
(migration.py: samples leave and arrive), paging (paged.py: preemption and resumption) and the
speculator (speculator.py: who drafts) — read and change them through these methods, never
through the core's private members.

- `Slots`: which sample holds each KV slot, and the per-slot decode inputs (`SlotArrays`) the
  next decode call is fed. `place` puts a sample into a free slot, `advance` sets a slot's
  inputs after it emitted tokens, `vacate` frees it.
- `LiveRequests`: every request the core holds (queued, in slots, or arrived by migration), as
  seeded, with the samples not yet done and the `when=critical` marks; a request is forgotten
  with its last sample.

No JAX: plain numpy arrays that every decode call sends.
"""

from __future__ import annotations

import numpy as np

from jaxrl_async.engines.base import GenerationRequest, SamplingParams, check_new_request_id
from jaxrl_async.engines.jax.scheduler import SlotSequence


class SlotArrays:
    """Per-slot decode inputs, kept on the host and sent with every decode call."""

    def __init__(self, n: int):
        self.tokens = np.zeros(n, np.int32)  # the token each slot feeds next
        self.positions = np.zeros(n, np.int32)  # its position
        self.seeds = np.zeros(n, np.uint32)
        self.sample_index = np.zeros(n, np.int32)
        self.token_index = np.zeros(n, np.int32)  # tokens the sample has generated
        self.temperature = np.zeros(n, np.float32)
        self.top_p = np.ones(n, np.float32)
        self.top_k = np.zeros(n, np.int32)
        self.remaining = np.zeros(n, np.int32)  # tokens the slot may still sample; 0: free
        self.stop_ids: list[tuple[int, ...]] = [()] * n

    def stop_table(self) -> np.ndarray:
        """[S, M] int32, each slot's stop tokens padded with -1; M a power of two >= 4, so that
        the decode step compiles once per width class, not per request."""
        width = 4
        while width < max(map(len, self.stop_ids)):
            width *= 2
        table = np.full((len(self.stop_ids), width), -1, np.int32)
        for slot, ids in enumerate(self.stop_ids):
            table[slot, :len(ids)] = ids
        return table

    def clear(self, slot: int) -> None:
        # Free slots decode greedily at position 0 so they never trigger the top-p/top-k sort;
        # remaining 0 keeps them from writing the cache.
        self.tokens[slot] = self.positions[slot] = self.token_index[slot] = self.remaining[slot] = 0
        self.stop_ids[slot] = ()
        self.temperature[slot], self.top_p[slot], self.top_k[slot] = 0.0, 1.0, 0


class Slots:
    """The core's `n` KV slots: the sample in each (None: free) and its decode inputs."""

    def __init__(self, n: int):
        self.seqs: list[SlotSequence | None] = [None] * n
        self.sampling: list[SamplingParams | None] = [None] * n  # each held sample's sampling
        self.arrays = SlotArrays(n)

    def __len__(self) -> int:
        return len(self.seqs)

    @property
    def active(self) -> int:
        return sum(s is not None for s in self.seqs)

    def free(self) -> list[int]:
        return [i for i, s in enumerate(self.seqs) if s is None]

    def occupied(self) -> list[tuple[int, SlotSequence]]:
        """(slot, sample) of every held slot, in slot order."""
        return [(i, s) for i, s in enumerate(self.seqs) if s is not None]

    def of_request(self, request_id: str) -> list[tuple[int, SlotSequence]]:
        return [(i, s) for i, s in self.occupied() if s.request_id == request_id]

    def place(self, slot: int, seq: SlotSequence, sp: SamplingParams) -> None:
        """Put a sample into a free slot: its sequence, and the decode inputs it feeds next."""
        assert self.seqs[slot] is None, f"slot {slot} holds {self.seqs[slot]}"
        a = self.arrays
        self.seqs[slot], self.sampling[slot] = seq, sp
        a.seeds[slot], a.sample_index[slot] = sp.seed, seq.sample_index
        a.temperature[slot], a.top_p[slot], a.top_k[slot] = sp.temperature, sp.top_p, sp.top_k
        a.stop_ids[slot] = tuple(sp.stop_token_ids)
        self.advance(slot)

    def advance(self, slot: int) -> None:
        """Set the slot's next inputs from its sample (after it emitted tokens)."""
        a, seq = self.arrays, self.seqs[slot]
        a.tokens[slot], a.positions[slot], a.token_index[slot] = seq.last_token, seq.position, seq.generated
        a.remaining[slot] = seq.max_new_tokens - seq.generated

    def vacate(self, slot: int) -> SlotSequence:
        """Free the slot; returns the sample it held."""
        seq = self.seqs[slot]
        self.seqs[slot], self.sampling[slot] = None, None
        self.arrays.clear(slot)
        return seq


class LiveRequests:
    """The requests a core holds, as seeded, with their samples not yet done (see module docstring)."""

    def __init__(self) -> None:
        self._requests: dict[str, GenerationRequest] = {}
        self._samples: dict[str, int] = {}  # request id -> samples not yet done
        self.critical: set[str] = set()  # `mark_critical`'s requests (speculation.when=critical)

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._requests

    def __len__(self) -> int:
        return len(self._requests)

    def __getitem__(self, request_id: str) -> GenerationRequest:
        return self._requests[request_id]

    def get(self, request_id: str) -> GenerationRequest | None:
        return self._requests.get(request_id)

    def samples(self, request_id: str) -> int:
        """The request's samples not yet done."""
        return self._samples[request_id]

    def add(self, request: GenerationRequest, samples: int) -> None:
        """Hold `request` with `samples` samples to deliver (ValueError for an id already held)."""
        check_new_request_id(request.request_id, self._requests)
        self._requests[request.request_id], self._samples[request.request_id] = request, samples

    def sample_done(self, request_id: str) -> None:
        """One of the request's samples delivered its last piece; the last one forgets it."""
        self._samples[request_id] -= 1
        if not self._samples[request_id]:
            self.forget(request_id)

    def forget(self, request_id: str) -> None:
        del self._requests[request_id], self._samples[request_id]
        self.critical.discard(request_id)
