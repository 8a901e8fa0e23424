"""Straggler migration in the JAX engine core: a request's unfinished samples leave one core and
arrive on another, generated prefix kept (engines/migration.py has the travelling state).

- `detach(core, request_id)`: the request's unfinished samples leave their slots (or the queue,
  or the arrivals list). Each sample's pending tokens are delivered first, as a piece that is not
  done, so the source's stream holds every token it sampled; the samples' state (sample index,
  all their generated tokens) goes into a `MovedRequest` with the request as the source seeded it.
  The core forgets the request: its slots are free, and an abort there is ignored.
- `attach(core, moved)`: the samples wait in the core's arrivals list (first in, first out) and
  are placed, ahead of the priority queue, as slots free up (`admit_arrivals`, at the start of
  each step): each sample's prompt + prefix (all but the last token) is prefilled into its own
  slot, packed like new prompts, and it decodes on at position len(prompt) + len(prefix) - 1 with
  token index len(prefix). Sampling keys depend on (seed, sample, token index) only, so with the
  same weights the moved sample draws the tokens it would have drawn unmoved; its prefix's keys
  and values are recomputed by the target's weights (what a preempted, re-prefilled sample gets
  in any engine).
- Arrivals count as the request's live samples: `abort` ends them (once), `has_work` sees them.
- Speculation (speculative.py): a moved request leaves its critical mark behind (the replicated
  front marks it again on the target); the n-gram draft reads the arrival's prompt + prefix, what
  it would have read unmoved.

Migration reads and changes a core only through its public slot API (`MigratingCore`: slots.py's
`Slots` and `LiveRequests`, the queue, the arrivals list, `prefill`), and imports no core.

Every sample still ends with exactly one done piece: the source never sends one for a moved
sample, the target sends it when the sample stops, reaches its length or is aborted.

Only the contiguous core in "partial" sync mode migrates (`migratable`): a paged core keeps its
preempted samples' pages on the host and admits through its page accounting (not done here), and
"drain" promises that in-flight samples finish on the weights they started on, which a target
with a pending swap could not keep.
"""

from __future__ import annotations

from collections import Counter
from typing import Protocol

from jaxrl_async.engines.base import GenerationRequest, SampleOutput, check_new_request_id
from jaxrl_async.engines.jax.config import EngineConfig
from jaxrl_async.engines.jax.scheduler import RequestQueue, SlotSequence
from jaxrl_async.engines.jax.slots import LiveRequests, Slots
from jaxrl_async.engines.migration import MovedRequest, MovedSample


class MigratingCore(Protocol):
    """What migration reads and changes of an engine core (core.py `EngineCore`): its public slot
    API. This module does not import the core, which imports it."""

    config: EngineConfig
    counters: Counter
    queue: RequestQueue
    slots: Slots
    requests: LiveRequests
    arrivals: list[SlotSequence]

    @property
    def migratable(self) -> bool: ...

    def check_request(self, request: GenerationRequest) -> None: ...

    def prefill(self, prefixes: list[tuple[list[int], int]]) -> None: ...


def detach(core: MigratingCore, request_id: str) -> tuple[MovedRequest | None, list[SampleOutput]]:
    """Take the request's unfinished samples out of `core`: (their state, the pieces they still
    had to deliver). (None, []) when the core holds none of them or cannot migrate."""
    request = core.requests.get(request_id)
    if not core.migratable or request is None:
        return None, []
    outputs: list[SampleOutput] = []
    if core.queue.remove(request_id) is not None:  # not admitted yet: every sample moves fresh
        samples = [MovedSample(i, ()) for i in range(request.sampling.n)]
    else:
        samples = []
        for slot, seq in core.slots.of_request(request_id):
            if seq.pending_tokens:
                outputs.append(seq.flush())
            samples.append(MovedSample(seq.sample_index, tuple(seq.token_ids)))
            core.slots.vacate(slot)
        samples += [MovedSample(seq.sample_index, tuple(seq.token_ids)) for seq in take_arrivals(core, request_id)]
    live = core.requests.samples(request_id)
    assert len(samples) == live, (request_id, len(samples), live)
    core.requests.forget(request_id)  # its critical mark too (ReplicatedEngine re-marks it on the target)
    core.counters["migrated_out"] += len(samples)
    return MovedRequest(request, tuple(sorted(samples, key=lambda s: s.sample_index))), outputs


def attach(core: MigratingCore, moved: MovedRequest) -> None:
    """Queue the moved samples on `core`'s arrivals list (see the module docstring)."""
    if not core.migratable:
        raise ValueError(f"request {moved.request_id!r}: this engine core cannot take migrated samples "
                         f"(engine.page_size={core.config.page_size}, engine.sync_mode={core.config.sync_mode})")
    check_new_request_id(moved.request_id, core.requests)
    core.check_request(moved.request)
    core.requests.add(moved.request, len(moved.samples))
    core.arrivals += [moved_sequence(moved, s) for s in moved.samples]
    core.counters["migrated_in"] += len(moved.samples)


def moved_sequence(moved: MovedRequest, sample: MovedSample) -> SlotSequence:
    """A moved sample as it continues: its last token (the prompt's, if it generated none) is fed
    next, at the position after everything before it."""
    request, sp = moved.request, moved.request.sampling
    context = list(request.prompt_ids) + list(sample.token_ids)
    return SlotSequence(request_id=request.request_id, sample_index=sample.sample_index, last_token=context[-1],
                        position=len(context) - 1, max_new_tokens=sp.max_new_tokens,
                        stop_token_ids=frozenset(sp.stop_token_ids), generated=len(sample.token_ids),
                        token_ids=list(sample.token_ids))


def take_arrivals(core: MigratingCore, request_id: str) -> list[SlotSequence]:
    """Remove and return the request's samples still waiting on the arrivals list."""
    taken = [seq for seq in core.arrivals if seq.request_id == request_id]
    core.arrivals[:] = [seq for seq in core.arrivals if seq.request_id != request_id]
    return taken


def admit_arrivals(core: MigratingCore) -> None:
    """Place waiting arrivals into free slots, first in first out, and prefill each one's prompt
    + prefix (all but its last token) into its slot, packed into as few calls as fit."""
    free = core.slots.free()
    prefixes: list[tuple[list[int], int]] = []
    while core.arrivals and free:
        seq, slot = core.arrivals.pop(0), free.pop(0)
        request = core.requests[seq.request_id]
        core.slots.place(slot, seq, request.sampling)
        context = list(request.prompt_ids) + seq.token_ids
        if len(context) > 1:
            prefixes.append((context[:-1], slot))
    core.prefill(prefixes)
