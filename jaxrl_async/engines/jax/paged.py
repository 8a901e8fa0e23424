"""The paged engine core (`engine.page_size` > 0): continuous batching over KV pages.

`PagedEngineCore` is `EngineCore` (core.py) with the KV cache cut into `engine.kv_pages` pages
of `page_size` positions (paging.py keeps the tables, paged_attention.py reads them on device).
A sample holds the pages its positions use, not `max_len`, so at a fixed KV budget more samples
decode at once when most finish early; `num_slots` (the decode batch) may exceed what the pages
could hold at `max_len` each. The rules:

- Admission, in strict priority order as in the contiguous core: the head request is admitted
  when n slots are free and its pages are: its prompt's full pages once (shared by its n samples,
  one prefill) plus, per sample, the pages from the prompt's partial last page (copied per
  sample) up to what its first decode call writes. A request that could not be admitted into an
  empty engine is refused at `submit` (`check_request`), never left waiting forever.
- Growth: before each decode call every active sample takes the pages its next (up to k)
  positions need, oldest admission first.
- Back-pressure: when a sample cannot get its next page, the youngest active sample is
  preempted (as in vLLM, Kwon et al. 2023, with swapping): its pages' keys and values are copied
  to the host, its pages go back to the pool, and it waits in a resume list ahead of the queue.
  It resumes (oldest admission first, before any new request) in new pages that get its keys
  and values back, exactly as they were, and decodes on. So a preempted sample samples exactly
  what it would have sampled, whatever the weights did meanwhile (in "partial" mode its earlier
  keys and values stay as the old weights computed them, as for a sample never preempted):
  nothing is lost or delivered twice and every token keeps its version. In "drain" mode a
  preempted sample is in flight: it resumes, on the old weights, before the swap. Progress: the
  oldest active sample is preempted only when it is the only one left, and alone it fits
  (kv_pages >= max_len / page_size, `EngineConfig`'s check).
- Release: a finished, aborted or preempted sample returns its pages (a shared prompt page once
  its last sample lets go). Free + used pages = kv_pages after every step (`pages.check()`).

The decode step attends over the live pages only (the bucket above every position, rounded up
to whole pages): the gather reads those pages, so the contiguous core's max_len cut-off
(`compiles.LIVE_BUCKET_LIMITS`) does not apply. `paged_attention.KERNELS` picks the attention
implementation per backend (XLA's gather on CPU, the Pallas kernel on GPU/TPU).

Placement: the paged cache takes `sharding.cache_shardings` like the contiguous one (kv heads
on `tensor`); its page axis takes the batch axis's data x fsdp, which is 1 in an engine
replica's (1, 1, T) mesh, so every device holds every page of its heads.

Compilations: `engine_prefill_paged` once per prefill bucket, `engine_copy_page`,
`engine_read_pages` and `engine_write_pages` once (a slot's whole table row, max_len / page_size
pages, padded with the sentinel), `engine_decode_steps` once per live page count used.
"""

from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass

import jax
import numpy as np
from flax import nnx
from jax.sharding import Mesh

from jaxrl_async.engines.base import GenerationRequest, SampleOutput, SamplingParams
from jaxrl_async.engines.jax import compiles
from jaxrl_async.engines.jax.config import EngineConfig
from jaxrl_async.engines.jax.core import EngineCore, new_sequence
from jaxrl_async.engines.jax.packing import PackedRow
from jaxrl_async.engines.jax.paged_attention import init_paged_cache, kernel_for
from jaxrl_async.engines.jax.paging import PageTables
from jaxrl_async.engines.jax.scheduler import SlotSequence
from jaxrl_async.models.attention import KVCache
from jaxrl_async.models.config import ModelConfig


@dataclass
class _Preempted:
    """A sample waiting to resume: its sequence, sampling and admission order, and the keys and
    values of its pages (host arrays: per layer [max_len / page_size, ...], the first `pages` real)."""

    seq: SlotSequence
    sampling: SamplingParams
    order: int
    pages: int
    kv: tuple


class PagedEngineCore(EngineCore):
    """`EngineCore` over a paged KV cache (see the module docstring). Not thread-safe either."""

    def __init__(self, model: nnx.Module, model_config: ModelConfig, config: EngineConfig,
                 version: int = 0, mesh: Mesh | None = None):
        super().__init__(model, model_config, config, version, mesh)
        self.pages = PageTables(config.num_slots, config.max_len, config.page_size, config.total_pages)
        self.kernel = kernel_for(self.platform)
        self._order = [0] * config.num_slots  # admission order of each slot's sample
        self._admissions = itertools.count()
        self._resume: list[_Preempted] = []  # oldest admission first

    def _cache_maker(self, model_config: ModelConfig, config: EngineConfig):
        return functools.partial(init_paged_cache, model_config, config.total_pages, config.page_size,
                                 config.cache_dtype or model_config.dtype)

    # ------------------------------------------------------------------ queries

    @property
    def queued(self) -> int:
        return len(self.queue) + len(self._resume)

    @property
    def migratable(self) -> bool:
        """A paged core does not migrate: its admission counts pages (migration.py)."""
        return False

    @property
    def preempted(self) -> list[SlotSequence]:
        """The samples waiting to resume, oldest admission first."""
        return [p.seq for p in self._resume]

    def has_work(self) -> bool:
        return bool(self.active_slots or self._pending_weights
                    or ((self.queue or self._resume) and self.slots.free()))

    def _first_call_end(self, prefix_len: int, sp: SamplingParams) -> int:
        """End of the positions a fresh sample's first decode call writes."""
        return prefix_len + min(sp.max_new_tokens, self.config.decode_steps_per_call)

    # ------------------------------------------------------------------ commands

    def check_request(self, request: GenerationRequest) -> None:
        super().check_request(request)
        sp, prefix_len = request.sampling, len(request.prompt_ids) - 1
        need = self.pages.group_need(prefix_len, sp.n, self._first_call_end(prefix_len, sp))
        if need > self.config.total_pages:
            raise ValueError(
                f"request {request.request_id!r}: n={sp.n} samples of a {len(request.prompt_ids)}-token "
                f"prompt need {need} KV pages at admission, more than engine.kv_pages="
                f"{self.config.total_pages}")

    def abort(self, request_id: str) -> list[SampleOutput]:
        outputs = super().abort(request_id)
        waiting = [p for p in self._resume if p.seq.request_id == request_id]
        self._resume = [p for p in self._resume if p.seq.request_id != request_id]
        return outputs + [self._close(p.seq, "abort") for p in waiting]

    # ------------------------------------------------------------------ the step

    def step(self) -> list[SampleOutput]:
        """One iteration: maybe swap weights, grow (or preempt), admit, decode up to k tokens."""
        if self._pending_weights is not None and not self.active_slots and not self._resume:
            self._weights, self.version = self._pending_weights
            self._pending_weights = None
        self._grow()
        self._admit_paged()
        if not self.active_slots:
            return []
        return self._decode()

    def _call_end(self, slot: int) -> int:
        a = self.slots.arrays
        return int(a.positions[slot] + min(a.remaining[slot], self.config.decode_steps_per_call))

    def _grow(self) -> None:
        """Every active sample takes the pages of its next call, oldest first; preempt the
        youngest while pages are short."""
        seqs = self.slots.seqs
        active = sorted((s for s, _ in self.slots.occupied()), key=self._order.__getitem__)
        for slot in active:
            if seqs[slot] is None:  # preempted for an older sample
                continue
            end = self._call_end(slot)
            while self.pages.need(slot, end) > self.pages.pool.free:
                victim = max((s for s in active if seqs[s] is not None), key=self._order.__getitem__)
                self._preempt(victim)
                if victim == slot:
                    break
            if seqs[slot] is not None:
                self.pages.grow(slot, end)

    def _preempt(self, slot: int) -> None:
        kv = jax.device_get(self._steps.read_pages(self._cache, self.pages.table[slot]))
        sampling = self.slots.sampling[slot]
        self._resume.append(_Preempted(self.slots.vacate(slot), sampling, self._order[slot],
                                       len(self.pages.pages[slot]), kv))
        self._resume.sort(key=lambda p: p.order)
        self.pages.release(slot)
        self.counters["preemptions"] += 1

    def _admit_paged(self) -> None:
        """Resume preempted samples, then admit queued requests, while slots and pages last;
        prefill the new prompts (packed) and copy each group's partial prompt page."""
        free, k = self.slots.free(), self.config.decode_steps_per_call
        prefixes: list[tuple[list[int], int]] = []
        copies: list[tuple[int, int]] = []
        while self._resume and free:
            p = self._resume[0]
            end = p.seq.position + min(p.seq.max_new_tokens - p.seq.generated, k)
            if self.pages.pages_for(end) > self.pages.pool.free:
                break
            self._resume.pop(0)
            slot = free.pop(0)
            self.pages.grow(slot, end)
            self._place(slot, p.seq, p.sampling, p.order)
            # Its keys and values back into its first new pages (pages past them: sentinel, dropped).
            targets = np.full_like(self.pages.table[slot], self.config.total_pages)
            targets[:p.pages] = self.pages.table[slot, :p.pages]
            self._cache = self._steps.write_pages(self._cache, targets, *p.kv)

        def take(request: GenerationRequest) -> bool:
            sp, prefix_len = request.sampling, len(request.prompt_ids) - 1
            end = self._first_call_end(prefix_len, sp)
            if sp.n > len(free) or self.pages.group_need(prefix_len, sp.n, end) > self.pages.pool.free:
                return False
            slots = [free.pop(0) for _ in range(sp.n)]
            copies.extend(self.pages.admit_group(slots, prefix_len, end))
            order = next(self._admissions)
            for i, slot in enumerate(slots):
                self._place(slot, new_sequence(request, i), sp, order)
            if prefix_len:
                prefixes.append((request.prompt_ids[:-1], slots[0]))
            return True

        if self._pending_weights is None and not self._resume:
            self.queue.pop_while(take)
        self.prefill(prefixes)
        for src, dst in copies:
            self._cache = self._steps.copy_page(self._cache, np.int32(src), np.int32(dst))

    def _place(self, slot: int, seq: SlotSequence, sp: SamplingParams, order: int) -> None:
        self.slots.place(slot, seq, sp)
        self._order[slot] = order

    def _prefill_row(self, row: PackedRow) -> KVCache:
        """One prefill call: the row's tokens into their slots' pages."""
        ps, real = self.config.page_size, row.slots >= 0
        where = row.positions[0]
        pages = np.where(real, self.pages.table[np.maximum(row.slots, 0), where // ps],
                         self.config.total_pages).astype(np.int32)  # out of range: dropped
        offsets = np.where(real, where % ps, 0).astype(np.int32)
        return self._steps.prefill_paged(self.model_config, self._weights, self._cache, row.tokens,
                                         row.positions, row.segments, pages, offsets)

    def _finish(self, slot: int, reason) -> SampleOutput:
        self.pages.release(slot)
        return super()._finish(slot, reason)

    def _decode_length(self, need: int) -> int:
        """The live bucket above `need`, rounded up to whole pages (no max_len cut-off)."""
        return self.pages.pages_for(compiles.bucket(self.config, min(need, self.config.max_len))) * self.config.page_size

    def _decode_kwargs(self) -> dict:
        return {"page_table": self.pages.table, "kernel": self.kernel}

    def warmup(self) -> None:
        """Compile every prefill bucket, the page copy and every decode length now. Idle engine
        only (writes go to no page: all pages stay untouched)."""
        if self.active_slots or self._resume:
            busy = self.active_slots + len(self._resume)
            raise ValueError(f"warmup: needs an idle engine, {busy} samples are active")
        dropped = np.int32(self.config.total_pages)
        for width in self.config.buckets():
            zeros = np.zeros((1, width), np.int32)
            self._cache = self._steps.prefill_paged(self.model_config, self._weights, self._cache, zeros,
                                                    zeros, zeros, zeros[0] + dropped, zeros[0])
        self._cache = self._steps.copy_page(self._cache, dropped, dropped)
        row = self.pages.table[0]  # all sentinel on an idle engine
        kv = jax.device_get(self._steps.read_pages(self._cache, row))  # host arrays, as `_preempt` keeps
        self._cache = self._steps.write_pages(self._cache, row, *kv)
        for length in sorted({self._decode_length(b) for b in self.config.buckets()}):
            self._cache, tokens, *_ = self._run_decode(length)
        jax.block_until_ready(tokens)
