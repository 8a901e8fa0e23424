"""The synchronous core of the JAX engine: continuous batching over fixed KV-cache slots.

`EngineCore.step()` does one engine iteration and returns the outputs it produced:

1. weights: in "drain" sync mode, a pending weight update is applied once no slot is active
   (admission pauses while it waits); in "partial" mode `update_weights` swaps at once, between
   two decode steps, and in-flight samples continue on the new weights (their earlier keys and
   values stay as the old weights computed them, as in AReaL's partial rollout); with pinned
   adapter versions (LoRA, `adapter_versions` > 1) a pushed adapter that found every resident
   version pinned is installed once one frees (admission goes on meanwhile);
2. admission: migrated samples first (migration.py), then requests leave the priority queue while
   their `n` samples fit in free slots; each prompt is prefilled once (all but its last token)
   into its first slot, several prompts packed into one row (`prefill`, packing.py), and the
   prefix is copied into the prompt's other `n - 1` slots;
3. one decode call for every slot: up to `decode_steps_per_call` (k) decode steps in one jitted
   loop; a slot stops on device at a stop token or at its max_new_tokens. The host appends each
   slot's valid tokens, finishes samples and streams pieces exactly as k one-step iterations
   would (sampling keys depend on (seed, sample, token index) only: the same tokens for every
   k). Commands act between calls (up to k - 1 steps later than with k = 1); version tags stay
   exact. With `engine.speculation.*` on, the `Speculator` (speculator.py) may make the call
   draft-and-verify passes instead.

The decode call attends over the live bucket only (compiles.py: what compiles, and when).
Everything is deterministic given the submitted requests and their seeds, so tests drive the
core directly; `JaxEngine` (engine.py) runs it in a thread, and its `make_core` picks this core
or the paged one (paged.py). The host state is slots.py's public API (migration.py and paged.py
use it). Weights are kept in the generation layout (`inference_weights`: one array per layer),
made by one jitted copy when installed, beside a per-layer KV cache.

LoRA: a push may be a `LoraAdapter` (the trainer's adapter alone, models/lora.py) instead of full
weights. The core then keeps the weights it was built with as the base (no copy: installed weights
are never donated) and merges each pushed adapter into it (`layout.merge_adapter`, one jitted
call), so a push moves the adapter's bytes only, at the price of holding the base beside the
merged weights. With `engine.adapter_versions=K > 1` it merges nothing: the base and up to K
adapters stay resident and each sample runs on the version it was admitted on (sync mode
"pinned", adapter_versions.py): a pushed adapter becomes one more version at once, or at the first
iteration where a slot frees when every resident version still has live samples.

Placement: without a mesh, the cache goes to the weights' (first) device. With a (data, fsdp,
tensor) `Mesh` (typically (1, 1, T)), weights and cache take the sharding table and the steps
are jitted per core with explicit `out_shardings` (layout.py), so every step and weight install
keeps that layout. Left out on purpose: chunked prefill, prefix caching across requests.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
from typing import Any

import jax
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from jaxrl_async.engines.base import GenerationRequest, RequestLimits, SampleOutput, check_new_request_id
from jaxrl_async.engines.jax import compiles, layout, migration
from jaxrl_async.engines.jax.adapter_versions import AdapterVersions
from jaxrl_async.engines.jax.config import EngineConfig
from jaxrl_async.engines.jax.packing import PackedRow, packed_rows
from jaxrl_async.engines.jax.scheduler import RequestQueue, SlotSequence
from jaxrl_async.engines.jax.slots import LiveRequests, Slots
from jaxrl_async.engines.jax.speculator import Speculator
from jaxrl_async.engines.jax.weights import accept_params
from jaxrl_async.models.attention import KVCache, init_cache
from jaxrl_async.models.config import ModelConfig
from jaxrl_async.models.lora import LoraAdapter, check_adapter
from jaxrl_async.sharding import cache_shardings, param_shardings


class EngineCore:
    """Continuous batching over `config.num_slots` slots of one model (see module docstring).

    Its public slot API (migration.py, paged.py, speculator.py use it): `slots`, `requests`
    (slots.py), `queue`, `arrivals` (migrated samples waiting for a slot), `counters`, `prefill`.
    `mesh`: None keeps weights and cache on the model's device (see the module docstring).
    Not thread-safe: call every method from one thread (JaxEngine's worker thread).
    """

    def __init__(self, model: nnx.Module, model_config: ModelConfig, config: EngineConfig,
                 version: int = 0, mesh: Mesh | None = None):
        if config.max_len > model_config.max_position_embeddings:
            raise ValueError(
                f"EngineConfig.max_len={config.max_len}: exceeds the model's "
                f"max_position_embeddings={model_config.max_position_embeddings}")
        self.config = config
        self.model_config = model_config
        self.limits = RequestLimits(context=config.max_len, context_key="engine.max_len", samples=config.num_slots,
                                    samples_key="engine.num_slots", vocab_size=model_config.vocab_size)
        self.version = version
        self.mesh = mesh
        state = nnx.state(model, nnx.Param)
        params = nnx.to_pure_dict(state)
        placement = (jax.tree.map(lambda x: x.sharding, params) if mesh is None
                     else nnx.to_pure_dict(param_shardings(state, mesh)))
        # What new weights must look like (shapes, dtypes, shardings), without holding them.
        self._reference = jax.tree.map(
            lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), params, placement)
        make_cache = self._cache_maker(model_config, config)
        if mesh is None:
            self._steps = layout.SHARED_STEPS
        else:
            cache_placement = cache_shardings(jax.eval_shape(make_cache), mesh)
            self._steps = layout.mesh_steps(mesh, cache_placement, layout.generation_shardings(self._reference))
            self._cache = jax.jit(make_cache, out_shardings=cache_placement)()  # made in place
        # The engine's own committed copy: updates arrive committed too, so the jitted steps
        # see the same input shardings before and after a swap (no recompilation).
        self._full_installs = 0  # full weight sets accepted; 1 = only the ones built with
        self._base: dict | None = None  # LoRA: the built-with weights, the adapters' base
        # adapter_versions > 1: admissions pin their version until a full-weights push shows
        # that pushes are not adapters; the resident adapters exist from the first adapter push.
        self._pins = config.adapter_versions > 1
        self._adapters: AdapterVersions | None = None
        self._weights = self.check_params(params)
        device = next(iter(jax.tree.leaves(self._weights)[0].devices()))
        if mesh is None:
            # Committed to the weights' device like every step output, so that the first call of
            # a step does not compile for an uncommitted cache and the second for a committed one.
            self._cache = jax.device_put(make_cache(), device)
        # Work done, for metrics: prefills, prefill_tokens (unpadded), decode_steps, tokens,
        # drafted / accepted / speculating (speculator.py), migrated_in / migrated_out.
        self.counters: collections.Counter[str] = collections.Counter()
        self.queue = RequestQueue()
        self.slots = Slots(config.num_slots)
        self.requests = LiveRequests()
        self.arrivals: list[SlotSequence] = []  # migrated samples waiting for a slot (migration.py)
        self._pending_weights: tuple[dict, int] | None = None
        self._seeds = np.random.default_rng(config.seed)
        # The backend the steps run on: it picks the live-bucket cut-off (compiles.LIVE_BUCKET_LIMITS).
        self.platform = (mesh.devices.flat[0] if mesh is not None else device).platform
        self.speculator = Speculator(config, model_config)

    def _cache_maker(self, model_config: ModelConfig, config: EngineConfig):
        """A function of no arguments that makes the all-zero cache: `num_slots` rows of max_len."""
        return functools.partial(init_cache, model_config, config.num_slots, config.max_len,
                                 config.cache_dtype or model_config.dtype)

    # ------------------------------------------------------------------ queries

    @property
    def active_slots(self) -> int:
        return self.slots.active

    @property
    def queued(self) -> int:
        return len(self.queue)

    @property
    def weights(self) -> dict:
        """The installed weights in the generation layout (read them, do not donate them)."""
        return self._weights

    @property
    def cache(self) -> KVCache:
        """The KV cache (read it between steps; the next step donates it)."""
        return self._cache

    @property
    def weights_pending(self) -> bool:
        return self._pending_weights is not None

    @property
    def migratable(self) -> bool:
        """Whether requests may leave and arrive (`detach` / `attach`): "partial" sync mode only,
        and not with adapter_versions > 1 (another replica need not hold a pinned version)."""
        return self.config.sync_mode == "partial" and self.config.adapter_versions == 1

    @property
    def adapter_versions(self) -> dict | None:
        """With adapter_versions > 1: K, the resident versions and what the pushes did
        (adapter_versions.py `summary`); None otherwise."""
        if self.config.adapter_versions == 1:
            return None
        if self._adapters is None:
            return {"versions": self.config.adapter_versions, "resident": [self.version], "pushes_pinned": 0,
                    "pushes_waited": 0}
        return self._adapters.summary()

    def has_work(self) -> bool:
        """Whether `step()` would do anything."""
        return bool(self.active_slots or self._pending_weights
                    or ((self.queue or self.arrivals) and self.slots.free()))

    # ------------------------------------------------------------------ commands

    def check_request(self, request: GenerationRequest) -> None:
        """A one-line ValueError naming the request when it can never run here (`RequestLimits`,
        shared with vLLM). Reads only configs: any thread may call it."""
        self.limits.check(request)

    def submit(self, request: GenerationRequest) -> None:
        check_new_request_id(request.request_id, self.requests)
        self.check_request(request)
        if request.sampling.seed is None:
            seed = int(self._seeds.integers(2**32))
            request = dataclasses.replace(
                request, sampling=dataclasses.replace(request.sampling, seed=seed))
        self.requests.add(request, request.sampling.n)
        self.queue.push(request)

    def abort(self, request_id: str) -> list[SampleOutput]:
        """End the request's unfinished samples ("abort"); [] for an unknown or finished id."""
        queued = self.queue.remove(request_id)
        if queued is not None:
            self.requests.forget(request_id)
            return [SampleOutput(request_id, i, [], [], [], "abort", True)
                    for i in range(queued.sampling.n)]
        outputs = [self._finish(slot, "abort") for slot, _ in self.slots.of_request(request_id)]
        return outputs + [self._close(seq, "abort") for seq in migration.take_arrivals(self, request_id)]

    def detach(self, request_id: str) -> tuple[Any, list[SampleOutput]]:
        """The request's unfinished samples leave: (`MovedRequest` | None, pieces they still had
        to deliver); see migration.py."""
        return migration.detach(self, request_id)

    def attach(self, moved: Any) -> None:
        """Continue a `MovedRequest`'s samples here, ahead of the queue (migration.py)."""
        migration.attach(self, moved)

    def mark_critical(self, request_id: str) -> None:
        """With `speculation.when=critical`, the request's unfinished samples draft from now on;
        an unknown or finished id is ignored (engines/base.py's contract)."""
        if request_id in self.requests:
            self.requests.critical.add(request_id)

    def check_params(self, params: Any) -> dict:
        """Validate new weights against the engine's (ValueError naming the leaf) and copy them
        into the generation layout on the engine's devices (with a mesh: device to device,
        layout.regrouped). A `LoraAdapter` is checked against the layers' weights and merged into
        the base (module docstring)."""
        if isinstance(params, LoraAdapter):
            return self._resident(params) if self.config.adapter_versions > 1 else self._merged(params)
        if self.mesh is not None:
            params = layout.regrouped(params, self._reference)
        self._full_installs += 1
        return self._steps.install(accept_params(self._reference, params))

    def _merged(self, adapter: LoraAdapter) -> dict:
        self._base_for(adapter)
        return self._steps.merge(self._base, jax.device_put(adapter, self._adapter_place()))

    def _resident(self, adapter: LoraAdapter) -> LoraAdapter:
        """adapter_versions > 1: the checked adapter on the engine's devices, installed unmerged."""
        self._base_for(adapter)
        return jax.device_put(adapter, self._adapter_place())

    def _base_for(self, adapter: LoraAdapter) -> None:
        check_adapter(self._reference["layers"], adapter, "the pushed adapter")
        if self._base is None:
            if self._full_installs > 1:
                raise ValueError("update_weights: a LoRA adapter after full weights; the engine no longer holds "
                                 "the base model the adapter trains on")
            self._base = self._weights

    def _adapter_place(self):
        return (NamedSharding(self.mesh, PartitionSpec()) if self.mesh is not None
                else next(iter(jax.tree.leaves(self._weights)[0].devices())))

    def update_weights(self, params: Any, version: int) -> None:
        """Swap weights now ("partial") or once in-flight samples finish ("drain"); `params`: an
        nnx.State (or pure dict) of the model's `nnx.Param`s. A newer update replaces a pending one.
        With adapter_versions > 1 an adapter becomes one more resident version now, or once a
        version frees (module docstring)."""
        self.install_weights(self.check_params(params), version)

    def install_weights(self, weights: dict, version: int) -> None:
        """`update_weights` for weights that `check_params` already accepted (and copied)."""
        latest = self._pending_weights[1] if self._pending_weights else self.version
        if version < latest:
            raise ValueError(f"update_weights: version={version} goes backwards (engine is at {latest})")
        if isinstance(weights, LoraAdapter):  # adapter_versions > 1: one more resident version
            self._pending_weights = (weights, version)
            if not self._install_pinned():
                self._adapters.waited += 1
        elif self.config.sync_mode == "partial":
            self._weights, self.version = weights, version
            if self._pins:  # full weights: nothing to pin to, in-flight samples go on as "partial"
                self._pins, self._adapters = False, None
                for _, seq in self.slots.occupied():
                    seq.pinned = None
        else:
            self._pending_weights = (weights, version)

    def _install_pinned(self) -> bool:
        """Install the pending adapter into a free entry; False when every entry is pinned."""
        adapter, version = self._pending_weights
        if self._adapters is None:
            self._adapters = AdapterVersions(self.config.adapter_versions, adapter, self.version,
                                             self._adapter_place())
        pinned = [seq.pinned for _, seq in self.slots.occupied()] + [seq.pinned for seq in self.arrivals]
        entry = self._adapters.free_entry(pinned)
        if entry is None:
            return False
        self._adapters.install(entry, adapter, version)
        self.version, self._pending_weights = version, None
        return True

    # ------------------------------------------------------------------ the step

    def step(self) -> list[SampleOutput]:
        """One iteration: maybe swap weights, admit, decode up to k tokens per active slot."""
        pinned_push = self._pending_weights is not None and isinstance(self._pending_weights[0], LoraAdapter)
        if pinned_push:  # a pinned push waits for a free entry, not for a drain; admission goes on
            self._install_pinned()
        elif self._pending_weights is not None and not self.active_slots:
            self._weights, self.version = self._pending_weights
            self._pending_weights = None
        if self._pending_weights is None or pinned_push:
            migration.admit_arrivals(self)
            self._admit(self.queue.pop_admissible(len(self.slots.free())))
        return self._decode() if self.active_slots else []

    def _decode(self) -> list[SampleOutput]:
        """One decode call over every slot (the speculator's, when it drafts) and its outputs."""
        drafting = self.speculator.drafting(self.slots, self.requests)
        if drafting is None:
            self._cache, tokens, logprobs, count, steps = self._run_decode()
            self.counters["decode_calls"] += 1
            self.counters["decode_steps"] += int(steps)
        else:
            self._cache, tokens, logprobs, count = self.speculator.step(
                self._weights, self._cache, self.slots, self.requests, drafting, self._decode_length, self.counters)
        tokens, logprobs, count = np.asarray(tokens), np.asarray(logprobs), np.asarray(count)
        self.counters["tokens"] += int(count.sum())
        return self._emit(tokens, logprobs, count)

    def _admit(self, requests: list[GenerationRequest]) -> None:
        """Give each request its `n` slots, prefill the prompts (packed), copy shared prefixes."""
        free = iter(self.slots.free())
        shared = []
        for request in requests:
            sp, prompt = request.sampling, request.prompt_ids
            slots = [next(free) for _ in range(sp.n)]
            for i, slot in enumerate(slots):
                seq = new_sequence(request, i)
                if self._pins:  # runs on the newest resident version until it ends
                    seq.pinned = self.version
                self.slots.place(slot, seq, sp)
            if len(prompt) > 1:  # the last prompt token is fed by the first decode step
                shared.append((prompt[:-1], slots))
        self.prefill([(prefix, slots[0]) for prefix, slots in shared])
        for prefix, slots in shared:
            width = compiles.bucket(self.config, len(prefix))
            for slot in slots[1:]:
                self._cache = self._steps.copy_prefix(self._cache, np.int32(slots[0]), np.int32(slot), width)

    def prefill(self, prefixes: list[tuple[list[int], int]]) -> None:
        """Prefill each (prefix tokens, slot) into its slot at positions 0.., packed into as few
        calls as fit (packing.py)."""
        for row in packed_rows(prefixes, self.config):
            self._cache = self._prefill_row(row)
            self.counters["prefills"] += row.prefixes
            self.counters["prefill_calls"] += 1
            self.counters["prefill_tokens"] += row.length

    def _prefill_row(self, row: PackedRow) -> KVCache:
        """One prefill call: the row's tokens into their slots' cache rows."""
        slots = np.where(row.slots >= 0, row.slots, self.config.num_slots).astype(np.int32)  # out of range: dropped
        return self._steps.prefill(self.model_config, self.step_weights(), self._cache, row.tokens,
                                   row.positions, row.segments, slots)

    def step_weights(self) -> dict:
        """What the step functions compute with: the installed weights, plus with resident
        adapters (adapter_versions > 1) the stack and each slot's entry (its pinned version's)."""
        if self._adapters is None:
            return self._weights
        entries = np.zeros(self.config.num_slots, np.int32)
        for slot, seq in self.slots.occupied():
            if seq.pinned is not None:
                entries[slot] = self._adapters.entry_of(seq.pinned)
        return self._adapters.weights(self._weights, entries)

    def _emit(self, tokens: np.ndarray, logprobs: np.ndarray, count: np.ndarray) -> list[SampleOutput]:
        """Append each slot's `count` new tokens, finish and stream samples as count one-step
        iterations would, and set the next step's inputs."""
        outputs, every = [], self.config.stream_every
        for slot, seq in self.slots.occupied():
            reason, version = None, self.version if seq.pinned is None else seq.pinned
            for j in range(count[slot]):  # as count[slot] one-step iterations would
                reason = seq.append(int(tokens[slot, j]), float(logprobs[slot, j]), version)
                if reason is not None:
                    break
                if every and len(seq.pending_tokens) >= every:
                    outputs.append(seq.flush())
            if reason is not None:
                outputs.append(self._finish(slot, reason))
            else:
                self.slots.advance(slot)
        return outputs

    def _finish(self, slot: int, reason) -> SampleOutput:
        return self._close(self.slots.vacate(slot), reason)

    def _close(self, seq: SlotSequence, reason) -> SampleOutput:
        """The sample's last piece; its request is forgotten with its last sample."""
        self.requests.sample_done(seq.request_id)
        return seq.flush(reason)

    def warmup(self) -> None:
        """Compile every prefill bucket and the decode step of every decode length now rather than on
        first use. Only on an idle engine: the prefill writes garbage into slot 0's rows.
        """
        if self.active_slots:
            raise ValueError(f"warmup: needs an idle engine, {self.active_slots} slots are active")
        for width in self.config.buckets():
            zeros = np.zeros((1, width), np.int32)
            self._cache = self._steps.prefill(self.model_config, self.step_weights(), self._cache, zeros,
                                              zeros, zeros, zeros[0])
            self._cache = self._steps.copy_prefix(self._cache, np.int32(0), np.int32(0), width)
        for length in sorted({self._decode_length(b) for b in self.config.buckets()}):
            self._cache, tokens, *_ = self._run_decode(length)
        jax.block_until_ready(tokens)

    def _live_length(self) -> int:
        """The attention bucket of the next decode call: above every position it feeds."""
        a, k = self.slots.arrays, self.config.decode_steps_per_call
        active = a.remaining > 0
        need = int(np.max(a.positions + np.minimum(a.remaining, k), where=active, initial=1))
        return self._decode_length(need)

    def _decode_length(self, need: int) -> int:
        """The live bucket above `need`, or max_len past the backend's cut-off (compiles.py)."""
        return compiles.decode_length(self.config, self.platform, need)

    def _run_decode(self, length: int | None = None):
        a = self.slots.arrays
        return self._steps.decode(self.model_config, length or self._live_length(),
                                  self.config.decode_steps_per_call, self.step_weights(), self._cache,
                                  a.tokens, a.positions, a.seeds, a.sample_index, a.token_index,
                                  a.temperature, a.top_p, a.top_k, a.remaining, a.stop_table(),
                                  **self._decode_kwargs())

    def _decode_kwargs(self) -> dict:
        """Extra arguments of the decode step (a paged core's page table); none here."""
        return {}


def new_sequence(request: GenerationRequest, sample_index: int) -> SlotSequence:
    """Sample `sample_index` of a request as admitted: its prompt's last token is fed next, at
    position len(prompt) - 1."""
    prompt, sp = request.prompt_ids, request.sampling
    return SlotSequence(request_id=request.request_id, sample_index=sample_index, last_token=prompt[-1],
                        position=len(prompt) - 1, max_new_tokens=sp.max_new_tokens,
                        stop_token_ids=frozenset(sp.stop_token_ids))
