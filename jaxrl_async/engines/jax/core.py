"""The synchronous core of the JAX engine: continuous batching over fixed KV-cache slots.

`EngineCore.step()` does one engine iteration and returns the outputs it produced:

1. weights: in "drain" sync mode, a pending weight update is applied once no slot is active
   (admission pauses while it waits); in "partial" mode `update_weights` swaps at once, between
   two decode steps, and in-flight samples continue on the new weights (their earlier keys and
   values stay as the old weights computed them, as in AReaL's partial rollout);
2. admission: requests leave the priority queue while their `n` samples fit in free slots;
   each prompt is prefilled once (all but its last token) into its first slot, several prompts
   packed into one row padded to a power-of-two bucket, and the prefix is copied into the
   prompt's other `n - 1` slots;
3. one decode call for every slot: up to `decode_steps_per_call` (k) decode steps in one jitted
   loop, each feeding each slot's last token and sampling the next one; a slot stops on device
   at a stop token or at its max_new_tokens, and the loop ends once every slot has stopped. The
   host then appends each slot's valid tokens, finishes samples and streams pieces exactly as k
   one-step iterations would (sampling keys depend on (seed, sample, token index) only, so the
   tokens are the same for every k). Commands (aborts, new weights, admission of new requests)
   act between calls, so they wait up to k - 1 decode steps longer than with k = 1; version
   tags stay exact, since weights only change between calls.

With `engine.speculation.when` always (or critical: the requests `mark_critical` names) and at
most `max_active` slots active, step 3 is instead one call of up to k draft-and-verify passes
(speculative.py: exact speculative sampling, n-gram or self-draft), taken when some slot has a
draft; the host part is `_drafts` / `_speculative_step`, the rest of the core is unchanged.

The decode step attends over cache positions [0, L) only, L the smallest bucket (the prefill
buckets: min_bucket * 2**i) above every active slot's position after the call, when L is at
most the backend's cut-off (`LIVE_BUCKET_LIMITS`: max_len / 4 on CPU, 1,024 on GPU), else
max_len: a slot at position 100 costs what a 128-token context costs, not max_len.

Everything is deterministic given the submitted requests and their seeds, so tests drive the
core directly; `JaxEngine` (engine.py) runs it in a thread for the async runtime.

The engine keeps its weights in the generation layout (`inference_weights`: one array per
layer), made by one jitted copy when weights are installed, and a per-layer KV cache.

Placement: without a mesh, the cache goes to the weights' (first) device. With a
`jax.sharding.Mesh` (axes data / fsdp / tensor, typically (1, 1, T): one engine replica over T
devices), the weights take the model's logical-axis table (`sharding.param_shardings`: heads,
kv heads, MLP and vocab on `tensor`) and the cache `sharding.cache_shardings`. The core's steps
are then jitted per core with explicit `out_shardings`, so every step returns the cache in the
layout it was given and every weight install produces the same layout: the next step and the
next weight swap find the shardings they were compiled for. Pushed weights of any layout are
moved onto the mesh device to device (`layout.regroup_for`), never through the host.
`EngineConfig.replicas / tensor_parallel / colocate` are read by the caller, which builds one
mesh per replica (`engines/replicated.py` runs them as one engine).

Compilations: `engine_prefill`, `engine_copy_prefix` once per bucket, `engine_decode_steps` once
per decode length (the buckets up to the cut-off, and max_len),
per model structure and engine shape (and the decode step again per width of the padded
stop-token table: 4, 8, 16, ... stop tokens per request).
Weight swaps never recompile. Without a mesh the jitted steps are module-level, so
engines of the same shapes share them; with a mesh each core compiles its own (its devices are
its own). `COMPILE_COUNTS` counts their backend compilations process-wide (from jax's compile
events, so it also sees recompilations without a retrace, e.g. for a changed input sharding).

`make_core` builds this core for `page_size` 0 (every slot owns `max_len` contiguous
positions) and `paged.PagedEngineCore` for a paged KV cache (page_size > 0).

Left out on purpose: chunked prefill of a prompt longer than one call, prefix caching across
requests.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

import jax
import numpy as np
from flax import nnx
from jax.sharding import Mesh

from jaxrl_async.engines.jax import layout, migration, speculative
from jaxrl_async.engines.base import (GenerationRequest, RequestLimits, SampleOutput, SamplingParams,
                                      check_new_request_id)
from jaxrl_async.engines.jax.scheduler import RequestQueue, SlotSequence
from jaxrl_async.engines.jax.weights import accept_params
from jaxrl_async.engines.speculation import SpeculationConfig
from jaxrl_async.models.config import DTYPES, ModelConfig
from jaxrl_async.models.transformer import KVCache, init_cache
from jaxrl_async.sharding import cache_shardings, param_shardings
from planner.configs import check
from planner.types import check_sync_mode

SyncMode = Literal["partial", "drain"]

COMPILE_COUNTS: collections.Counter[str] = collections.Counter()
_BACKEND_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"  # jax.monitoring event
_STEPS = ("engine_prefill", "engine_copy_prefix", "engine_decode_steps", "engine_prefill_paged", "engine_copy_page",
          "engine_read_pages", "engine_write_pages", "engine_speculate_rounds")


def _count_compile(event: str, duration_s: float, **kwargs) -> None:
    name = kwargs.get("fun_name", "")
    if event == _BACKEND_COMPILE_EVENT and name.startswith("jit(") and name[4:-1] in _STEPS:
        COMPILE_COUNTS[name[4:-1]] += 1


jax.monitoring.register_event_duration_secs_listener(_count_compile)


# The longest live bucket a contiguous engine's decode step attends over, per backend, as a
# function of max_len; a longer context reads the whole cache (max_len). Measured with
# benchmarks/bench_decode.py (step time vs live context, batch 32):
# - cpu: XLA:CPU reads a bucket as a dense copy of that part of the cache: at max_len 2048 bucket
#   64 costs 0.36x a whole-cache step, 512 0.8x, 1024 1.8x, so past a quarter of max_len reading
#   the whole cache in place is cheaper;
# - gpu (H200, benchmarks/results/decode_h200.md): a bucket is 1.14-1.27x faster up to 1,024
#   positions and about even (0.97x) at the whole 2048-position cache.
# A backend not listed takes the cpu rule. A paged engine always attends over its live pages.
LIVE_BUCKET_LIMITS: dict[str, Callable[[int], int]] = {
    "cpu": lambda max_len: max_len // 4,
    "gpu": lambda max_len: 1024,
}


@dataclass(frozen=True)
class EngineConfig:
    """Capacity and behaviour of the JAX engine.

    Attributes:
      num_slots: sequences decoded together (the batch of every decode step).
      max_len: KV positions per slot; a request needs len(prompt) + max_new_tokens <= max_len.
      min_bucket: smallest prompt bucket; buckets are min_bucket * 2**i, the last one max_len.
      sync_mode: "partial": new weights take effect at the next decode step and in-flight
        samples continue (partial rollout); "drain": admission stops, in-flight samples finish
        on the old weights, then the weights swap.
      stream_every: deliver a `SampleOutput` piece every this many new tokens of a sample;
        0 delivers each sample once, when it is done.
      decode_steps_per_call: k, decode steps per jitted call (and host round trip); the stop
        checks run on device. Outputs do not depend on k; commands (abort, weight swap, new
        admissions) wait up to k - 1 extra decode steps, and a slot freed mid-call is refilled
        at the call's end. 8: on CPU (benchmarks/bench_decode.py, tiny shape) batch-1 tokens/s
        is 2.7x k=1's (16: 3.2x) and batch 32 gets all of its 1.22x; the wait stays under 8
        steps, small against RL samples of hundreds of tokens. 1 is the one-step engine.
      seed: draws the seeds of requests that give none.
      cache_dtype: KV cache dtype ("float32" | "bfloat16"); None uses the model's dtype.
      replicas: data-parallel engine replicas, each with its own slots and KV cache; the
        runtime balances requests across them (`engines/replicated.py`).
      tensor_parallel: devices per replica; heads, kv heads and the MLP are sharded over them on
        the `tensor` mesh axis (the replica's mesh is (1, 1, tensor_parallel)).
      colocate: True: the replicas use the trainer's devices, time-shared with training;
        False: devices the trainer does not use.
      page_size: 0 (the default): every slot owns `max_len` contiguous KV positions. P > 0: the
        KV cache is `kv_pages` pages of P positions, taken as a sequence grows and returned when
        it ends; admission counts free pages as well as free slots, so `num_slots` may exceed
        what `max_len` reservations would allow (`paged.py` has the rules). P must divide
        max_len.
      kv_pages: total KV pages when page_size > 0; None: num_slots * max_len / page_size (the
        positions the contiguous cache holds). At least max_len / page_size, so that one
        sequence of max_len always fits (the rule that guarantees progress).
      speculation: `engine.speculation.*` (engines/speculation.py): exact speculative decoding
        (speculative.py) while at most `max_active` slots are active; contiguous cache only.

    `EngineCore` does not read the last three: the caller builds one mesh per replica from them
    and passes it (`EngineCore(..., mesh=)`).
    """

    name: ClassVar[str] = "jax"  # `engine.name`: its entry in engines/registry.py

    num_slots: int = 8
    max_len: int = 1024
    min_bucket: int = 16
    sync_mode: SyncMode = "partial"
    stream_every: int = 0
    decode_steps_per_call: int = 8
    seed: int = 0
    cache_dtype: str | None = None
    replicas: int = 1
    tensor_parallel: int = 1
    colocate: bool = True
    page_size: int = 0
    kv_pages: int | None = None
    speculation: SpeculationConfig = field(default_factory=SpeculationConfig)

    def __post_init__(self) -> None:
        p = "EngineConfig"
        for name in ("num_slots", "max_len", "min_bucket", "decode_steps_per_call", "replicas", "tensor_parallel"):
            value = getattr(self, name)
            check(isinstance(value, int) and value >= 1, f"{p}.{name}", value, "must be an int >= 1")
        check(self.min_bucket <= self.max_len, f"{p}.min_bucket", self.min_bucket, f"must be <= max_len={self.max_len}")
        check_sync_mode(f"{p}.sync_mode", self.sync_mode, ("partial", "drain"))  # resubmit: vLLM only
        check(isinstance(self.stream_every, int) and self.stream_every >= 0, f"{p}.stream_every", self.stream_every,
              "must be an int >= 0")
        check(self.cache_dtype is None or self.cache_dtype in DTYPES, f"{p}.cache_dtype", self.cache_dtype,
              f"must be None or one of {DTYPES}")
        check(isinstance(self.colocate, bool), f"{p}.colocate", self.colocate, "must be true or false")
        # The paging keys name the user's `engine.` key (the lead may move the others to it too).
        check(isinstance(self.page_size, int) and not isinstance(self.page_size, bool) and self.page_size >= 0,
              "engine.page_size", self.page_size, "must be an int >= 0 (0: contiguous slots)")
        check(self.page_size == 0 or self.max_len % self.page_size == 0, "engine.page_size", self.page_size,
              f"must divide engine.max_len={self.max_len}")
        if self.kv_pages is not None:
            check(self.page_size > 0, "engine.kv_pages", self.kv_pages, "needs engine.page_size > 0")
            least = self.max_len // self.page_size
            check(isinstance(self.kv_pages, int) and not isinstance(self.kv_pages, bool) and self.kv_pages >= least,
                  "engine.kv_pages", self.kv_pages,
                  f"must be an int >= max_len / page_size = {least} (one sequence of max_len must fit)")

        check(self.page_size == 0 or not self.speculation.enabled, "engine.speculation.when", self.speculation.when,
              "needs engine.page_size=0 (the paged engine does not speculate)")

    @property
    def kv_tokens(self) -> int:
        """KV positions the cache holds: num_slots * max_len, or kv_pages * page_size when paged."""
        return self.num_slots * self.max_len if self.page_size == 0 else self.total_pages * self.page_size

    @property
    def total_pages(self) -> int:
        """KV pages of a paged engine: `kv_pages`, or what num_slots * max_len positions take."""
        assert self.page_size > 0, "total_pages of a contiguous engine"
        return self.kv_pages if self.kv_pages is not None else self.num_slots * self.max_len // self.page_size

    def buckets(self) -> list[int]:
        """Prefill lengths: min_bucket, 2*min_bucket, ... capped by max_len."""
        out, b = [], self.min_bucket
        while b < self.max_len:
            out.append(b)
            b *= 2
        return out + [self.max_len]


class _SlotArrays:
    """Per-slot decode inputs, kept on the host and sent with every decode step."""

    def __init__(self, n: int):
        self.tokens = np.zeros(n, np.int32)
        self.positions = np.zeros(n, np.int32)
        self.seeds = np.zeros(n, np.uint32)
        self.sample_index = np.zeros(n, np.int32)
        self.token_index = np.zeros(n, np.int32)
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


class EngineCore:
    """Continuous batching over `config.num_slots` slots of one model (see module docstring).

    `detach` / `attach` move a request's unfinished samples to another core (migration.py).

    Not thread-safe: call every method from one thread (JaxEngine's worker thread).

    `mesh`: None keeps the weights on the model's device and the cache on that device; a
    (data, fsdp, tensor) mesh places both with the sharding table (see the module docstring).
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
        self._weights = self.check_params(params)
        device = next(iter(jax.tree.leaves(self._weights)[0].devices()))
        if mesh is None:
            # Committed to the weights' device like every step output, so that the first call of
            # a step does not compile for an uncommitted cache and the second for a committed one.
            self._cache = jax.device_put(make_cache(), device)
        # Work done, for metrics: prefills, prefill_tokens (unpadded), decode_steps, tokens.
        self.counters: collections.Counter[str] = collections.Counter()
        self._queue = RequestQueue()
        self._slots: list[SlotSequence | None] = [None] * config.num_slots
        self._arrays = _SlotArrays(config.num_slots)
        self._live: dict[str, int] = {}  # request id -> samples not yet done
        self._requests: dict[str, GenerationRequest] = {}  # live request id -> the request, seeded
        self._arrivals: list[SlotSequence] = []  # migrated samples waiting for a slot (migration.py)
        self._pending_weights: tuple[dict, int] | None = None
        self._seeds = np.random.default_rng(config.seed)
        # The backend the steps run on: it picks the live-bucket cut-off (LIVE_BUCKET_LIMITS).
        self.platform = (mesh.devices.flat[0] if mesh is not None else device).platform
        # Speculative decoding (speculative.py): the n-gram draft reads each sample's prompt and
        # tokens so far (`_context`); `when=critical` drafts the marked requests.
        self._spec = config.speculation
        self._draft_layers = (speculative.parse_draft_model(self._spec.draft_model, model_config.num_layers)
                              if self._spec.enabled and self._spec.method == "draft" else 0)
        self._critical: set[str] = set()
        self._speculate_step_fn = None

    def _cache_maker(self, model_config: ModelConfig, config: EngineConfig):
        """A function of no arguments that makes the all-zero cache: `num_slots` rows of max_len."""
        return functools.partial(init_cache, model_config, config.num_slots, config.max_len,
                                 config.cache_dtype or model_config.dtype)

    # ------------------------------------------------------------------ queries

    @property
    def active_slots(self) -> int:
        return sum(s is not None for s in self._slots)

    @property
    def queued(self) -> int:
        return len(self._queue)

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
        """Whether requests may leave and arrive (`detach` / `attach`): "partial" sync mode only."""
        return self.config.sync_mode == "partial"

    def has_work(self) -> bool:
        """Whether `step()` would do anything."""
        return bool(self.active_slots or self._pending_weights
                    or ((self._queue or self._arrivals) and self._free_slots()))

    def _free_slots(self) -> list[int]:
        return [i for i, s in enumerate(self._slots) if s is None]

    # ------------------------------------------------------------------ commands

    def check_request(self, request: GenerationRequest) -> None:
        """Raise a one-line ValueError naming the request when it can never run on this engine
        (`RequestLimits.check`, the rule the vLLM engine shares).

        Reads only the configs, so any thread may call it; `submit` adds the duplicate-id check.
        """
        self.limits.check(request)

    def submit(self, request: GenerationRequest) -> None:
        check_new_request_id(request.request_id, self._live)
        self.check_request(request)
        if request.sampling.seed is None:
            seed = int(self._seeds.integers(2**32))
            request = dataclasses.replace(
                request, sampling=dataclasses.replace(request.sampling, seed=seed))
        self._live[request.request_id] = request.sampling.n
        self._requests[request.request_id] = request
        self._queue.push(request)

    def abort(self, request_id: str) -> list[SampleOutput]:
        """End the request's unfinished samples ("abort"); [] for an unknown or finished id."""
        queued = self._queue.remove(request_id)
        if queued is not None:
            del self._live[request_id], self._requests[request_id]
            self._critical.discard(request_id)
            return [SampleOutput(request_id, i, [], [], [], "abort", True)
                    for i in range(queued.sampling.n)]
        outputs = []
        for slot, seq in enumerate(self._slots):
            if seq is not None and seq.request_id == request_id:
                outputs.append(self._finish(slot, "abort"))
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
        if request_id in self._live:
            self._critical.add(request_id)

    def check_params(self, params: Any) -> dict:
        """Validate new weights against the engine's (ValueError naming the leaf) and copy them
        into the generation layout (`inference_weights`), on the engine's devices.

        With a mesh, jax arrays of this process are first regrouped on their own devices
        (`regroup_for`), so that the move onto the engine's layout copies device buffers.
        """
        if self.mesh is not None:
            params = layout.regrouped(params, self._reference)
        return self._steps.install(accept_params(self._reference, params))

    def update_weights(self, params: Any, version: int) -> None:
        """Swap weights now ("partial") or once in-flight samples finish ("drain").

        `params` is an nnx.State (or its pure dict) of the model's `nnx.Param`s. A newer update
        replaces one still pending.
        """
        self.install_weights(self.check_params(params), version)

    def install_weights(self, weights: dict, version: int) -> None:
        """`update_weights` for weights that `check_params` already accepted (and copied)."""
        latest = self._pending_weights[1] if self._pending_weights else self.version
        if version < latest:
            raise ValueError(f"update_weights: version={version} goes backwards (engine is at {latest})")
        if self.config.sync_mode == "partial":
            self._weights, self.version = weights, version
        else:
            self._pending_weights = (weights, version)

    # ------------------------------------------------------------------ the step

    def step(self) -> list[SampleOutput]:
        """One iteration: maybe swap weights, admit, decode up to k tokens per active slot."""
        if self._pending_weights is not None and not self.active_slots:
            self._weights, self.version = self._pending_weights
            self._pending_weights = None
        if self._pending_weights is None:
            migration.admit_arrivals(self)
            self._admit(self._queue.pop_admissible(len(self._free_slots())))
        if not self.active_slots:
            return []
        speculating = self._drafts()
        return self._decode_step() if speculating is None else self._speculative_step(speculating)

    def _admit(self, requests: list[GenerationRequest]) -> None:
        """Give each request its `n` slots, prefill the prompts (packed), copy shared prefixes."""
        free = iter(self._free_slots())
        to_prefill = []
        for request in requests:
            sp, prompt = request.sampling, request.prompt_ids
            slots = [next(free) for _ in range(sp.n)]
            prefix_len = len(prompt) - 1  # the last prompt token is fed by the first decode step
            if prefix_len:
                to_prefill.append((prompt[:-1], slots))
            for i, slot in enumerate(slots):
                self._place(slot, new_sequence(request, i), sp)
        for pack in self._packs([prefix for prefix, _ in to_prefill]):
            self._prefill_pack([to_prefill[i] for i in pack])
        for prefix, slots in to_prefill:
            bucket = self._bucket(len(prefix))
            for slot in slots[1:]:
                self._cache = self._steps.copy_prefix(self._cache, np.int32(slots[0]), np.int32(slot),
                                                      bucket)

    def _place(self, slot: int, seq: SlotSequence, sp: SamplingParams) -> None:
        """Put a sample into a free slot: its sequence, and the decode inputs it feeds next."""
        a = self._arrays
        self._slots[slot] = seq
        a.tokens[slot], a.positions[slot], a.token_index[slot] = seq.last_token, seq.position, seq.generated
        a.seeds[slot], a.sample_index[slot] = sp.seed, seq.sample_index
        a.temperature[slot], a.top_p[slot], a.top_k[slot] = sp.temperature, sp.top_p, sp.top_k
        a.remaining[slot], a.stop_ids[slot] = seq.max_new_tokens - seq.generated, tuple(sp.stop_token_ids)

    def _bucket(self, length: int) -> int:
        return next(b for b in self.config.buckets() if b >= length)

    def _packs(self, prefixes: list[list[int]]) -> list[list[int]]:
        """Group prefix indices, in order, into rows of at most `max_len` tokens."""
        packs, total = [], self.config.max_len
        for i, prefix in enumerate(prefixes):
            if total + len(prefix) > self.config.max_len:
                packs.append([])
                total = 0
            packs[-1].append(i)
            total += len(prefix)
        return packs

    def _prefill_pack(self, pack: list[tuple[list[int], list[int]]]) -> None:
        """One prefill call for prompts packed into a row; each goes to its first slot."""
        bucket = self._bucket(sum(len(prefix) for prefix, _ in pack))
        tokens, positions = np.zeros((1, bucket), np.int32), np.zeros((1, bucket), np.int32)
        segments = np.full((1, bucket), -1, np.int32)
        slots = np.full(bucket, self.config.num_slots, np.int32)  # out of range: dropped
        offset = 0
        for i, (prefix, prompt_slots) in enumerate(pack):
            end = offset + len(prefix)
            tokens[0, offset:end], positions[0, offset:end] = prefix, np.arange(len(prefix))
            segments[0, offset:end], slots[offset:end] = i, prompt_slots[0]
            offset = end
        self._cache = self._steps.prefill(self.model_config, self._weights, self._cache, tokens,
                                          positions, segments, slots)
        self.counters["prefills"] += len(pack)
        self.counters["prefill_calls"] += 1
        self.counters["prefill_tokens"] += offset

    def _decode_step(self) -> list[SampleOutput]:
        self._cache, tokens, logprobs, count, steps = self._run_decode()
        tokens, logprobs, count = np.asarray(tokens), np.asarray(logprobs), np.asarray(count)
        self.counters["decode_calls"] += 1
        self.counters["decode_steps"] += int(steps)
        self.counters["tokens"] += int(count.sum())
        return self._emit(tokens, logprobs, count)

    def _drafts(self) -> np.ndarray | None:
        """The slots that draft in the next call [S] bool, or None for a plain decode call:
        speculation off, more than `max_active` active slots, or no slot with a draft now."""
        spec = self._spec
        if not spec.enabled or self.active_slots > spec.max_active:
            return None
        speculating, any_draft = np.zeros(self.config.num_slots, bool), False
        for slot, seq in enumerate(self._slots):
            if seq is None or (spec.when == "critical" and seq.request_id not in self._critical):
                continue
            speculating[slot] = True
            if self._arrays.remaining[slot] > 1 and not any_draft:  # one token left: nothing to draft
                any_draft = bool(self._draft_layers) or bool(speculative.ngram_draft(self._context(seq), spec.ngram, 1))
        return speculating if any_draft else None

    def _context(self, seq: SlotSequence) -> list[int]:
        """What the n-gram draft looks in: the sample's prompt and every token it generated (a
        migrated sample's prefix included)."""
        return list(self._requests[seq.request_id].prompt_ids) + seq.token_ids

    def _speculative_step(self, speculating: np.ndarray) -> list[SampleOutput]:
        """One call of up to `decode_steps_per_call` draft-and-verify passes (speculative.py)."""
        a, k, rounds = self._arrays, self._spec.tokens, self.config.decode_steps_per_call
        if self._speculate_step_fn is None:  # jitted per core: the cache keeps its layout
            cache_layout = jax.tree.map(lambda x: x.sharding, self._cache)
            self._speculate_step_fn = jax.jit(speculative.engine_speculate_rounds, static_argnums=(0, 1, 2, 3, 4, 5),
                                              donate_argnums=(7,), out_shardings=(cache_layout, *[None] * 6))
        history = np.zeros((self.config.num_slots, self.config.max_len if not self._draft_layers else 1), np.int32)
        hist_len = np.zeros(self.config.num_slots, np.int32)
        if not self._draft_layers:  # the n-gram drafts on device from each slot's context
            for slot, seq in enumerate(self._slots):
                if seq is not None:
                    text = self._context(seq)
                    history[slot, :len(text)], hist_len[slot] = text, len(text)
        active = a.remaining > 0
        need = int(np.max(a.positions + np.minimum(a.remaining, rounds * (k + 1)) + k, where=active, initial=1))
        self._cache, tokens, logprobs, count, drafted, accepted, passes = self._speculate_step_fn(
            self.model_config, self._decode_length(need), k, self._draft_layers, rounds, self._spec.ngram,
            self._weights, self._cache, a.tokens, a.positions, history, hist_len, speculating, a.seeds,
            a.sample_index, a.token_index, a.temperature, a.top_p, a.top_k, a.remaining, a.stop_table())
        tokens, logprobs, count = np.asarray(tokens), np.asarray(logprobs), np.asarray(count)
        self.counters["decode_calls"] += 1
        self.counters["decode_steps"] += int(passes)  # verify passes: one forward of the policy each
        self.counters["tokens"] += int(count.sum())
        self.counters["drafted"] += int(np.asarray(drafted).sum())
        self.counters["accepted"] += int(np.asarray(accepted).sum())
        return self._emit(tokens, logprobs, count)

    def _emit(self, tokens: np.ndarray, logprobs: np.ndarray, count: np.ndarray) -> list[SampleOutput]:
        """Append each slot's `count` new tokens, finish and stream samples as count one-step
        iterations would, and set the next step's inputs."""
        outputs = []
        a, every = self._arrays, self.config.stream_every
        for slot, seq in enumerate(self._slots):
            if seq is None:
                continue
            reason = None
            for j in range(count[slot]):  # as count[slot] one-step iterations would
                reason = seq.append(int(tokens[slot, j]), float(logprobs[slot, j]), self.version)
                if reason is not None:
                    break
                if every and len(seq.pending_tokens) >= every:
                    outputs.append(seq.flush())
            if reason is not None:
                outputs.append(self._finish(slot, reason))
                continue
            a.tokens[slot], a.positions[slot], a.token_index[slot] = seq.last_token, seq.position, seq.generated
            a.remaining[slot] = seq.max_new_tokens - seq.generated
        return outputs

    def _finish(self, slot: int, reason) -> SampleOutput:
        seq = self._slots[slot]
        self._slots[slot] = None
        self._arrays.clear(slot)
        return self._close(seq, reason)

    def _close(self, seq: SlotSequence, reason) -> SampleOutput:
        """The sample's last piece; its request is forgotten with its last sample."""
        self._live[seq.request_id] -= 1
        if not self._live[seq.request_id]:
            del self._live[seq.request_id], self._requests[seq.request_id]
            self._critical.discard(seq.request_id)
        return seq.flush(reason)

    def warmup(self) -> None:
        """Compile every prefill bucket and the decode step of every decode length now rather than on
        first use. Only on an idle engine: the prefill writes garbage into slot 0's rows.
        """
        if self.active_slots:
            raise ValueError(f"warmup: needs an idle engine, {self.active_slots} slots are active")
        for bucket in self.config.buckets():
            zeros = np.zeros((1, bucket), np.int32)
            self._cache = self._steps.prefill(self.model_config, self._weights, self._cache, zeros,
                                              zeros, zeros, zeros[0])
            self._cache = self._steps.copy_prefix(self._cache, np.int32(0), np.int32(0), bucket)
        for length in sorted({self._decode_length(b) for b in self.config.buckets()}):
            self._cache, tokens, *_ = self._run_decode(length)
        jax.block_until_ready(tokens)

    def _live_length(self) -> int:
        """The attention bucket of the next decode call: above every position it feeds."""
        a, k = self._arrays, self.config.decode_steps_per_call
        active = a.remaining > 0
        need = int(np.max(a.positions + np.minimum(a.remaining, k), where=active, initial=1))
        return self._decode_length(need)

    def _decode_length(self, need: int) -> int:
        """The live bucket above `need`, or max_len past the backend's cut-off (LIVE_BUCKET_LIMITS)."""
        length = self._bucket(min(need, self.config.max_len))
        limit = LIVE_BUCKET_LIMITS.get(self.platform, LIVE_BUCKET_LIMITS["cpu"])(self.config.max_len)
        return length if length <= limit else self.config.max_len

    def _run_decode(self, length: int | None = None):
        a = self._arrays
        return self._steps.decode(self.model_config, length or self._live_length(),
                                  self.config.decode_steps_per_call, self._weights, self._cache,
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


def make_core(model: nnx.Module, model_config: ModelConfig, config: EngineConfig, version: int = 0,
              mesh: Mesh | None = None) -> EngineCore:
    """The engine core `config` asks for: `EngineCore` (page_size 0) or `PagedEngineCore`."""
    if config.page_size == 0:
        return EngineCore(model, model_config, config, version, mesh)
    from jaxrl_async.engines.jax.paged import PagedEngineCore  # paged.py builds on this module

    return PagedEngineCore(model, model_config, config, version, mesh)
