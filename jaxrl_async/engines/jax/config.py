"""`engine=jax`'s keys: `EngineConfig`, the capacity and behaviour of the native JAX engine.

A config module imports nothing heavy (no JAX, flax, torch, ray or vLLM: tests/test_layers.py
holds it), so typing a run's config and `--help` never load a backend. The engine's code reads
this dataclass (core.py, paged.py); the registry (engines/registry.py) names it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Literal

from jaxrl_async.engines.speculation import SpeculationConfig
from planner.configs import check
from planner.types import check_sync_mode

SyncMode = Literal["partial", "drain"]
# The KV cache dtypes: the model's own dtypes (models/config.py DTYPES, which this module does not
# import: the models package loads flax; tests/jaxrl_async/engines/jax/test_config.py holds the two equal).
CACHE_DTYPES = ("float32", "bfloat16")


@dataclass(frozen=True)
class EngineConfig:
    """Capacity and behaviour of the JAX engine (keys under `engine.`).

    Attributes:
      num_slots: sequences decoded together (the batch of every decode step); must be >= the
        run's group_size, since a group's samples decode together.
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
      seed: draws the seeds of requests that give none (the runtime always gives one).
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
        sequence of max_len always fits (the rule that guarantees progress), and at least
        num_slots: a decoding sample holds the page of its position, so with fewer pages the
        slots past kv_pages never decode and a group of num_slots samples, which the request
        limits accept, could never be admitted (refused here, not at the first request).
      speculation: `engine.speculation.*` (engines/speculation.py): exact speculative decoding
        (speculative.py) in the weight-bound regime that `engine.speculation.max_active` sets;
        contiguous cache only.
      adapter_versions: K, LoRA adapter versions resident at once (`trainer.lora.rank > 0`; with
        full fine-tuning it cannot act). 1: each pushed adapter is merged into the base and
        in-flight samples follow `sync_mode`. K > 1 (sync mode "pinned", core.py): the base plus
        up to K adapters stacked, applied unmerged per slot; a sample runs on the version it was
        admitted on until it ends, a push replaces the oldest version no live sample is pinned
        to, and waits for a slot to free when every one is. Needs sync_mode=partial, the
        contiguous cache and no speculation; a pinned request does not migrate.

    `EngineCore` does not read replicas, tensor_parallel or colocate: the caller builds one mesh
    per replica from them and passes it (`EngineCore(..., mesh=)`).
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
    adapter_versions: int = 1

    def __post_init__(self) -> None:
        p = "EngineConfig"
        for name in ("num_slots", "max_len", "min_bucket", "decode_steps_per_call", "replicas", "tensor_parallel"):
            value = getattr(self, name)
            check(isinstance(value, int) and value >= 1, f"{p}.{name}", value, "must be an int >= 1")
        check(self.min_bucket <= self.max_len, f"{p}.min_bucket", self.min_bucket, f"must be <= max_len={self.max_len}")
        check_sync_mode(f"{p}.sync_mode", self.sync_mode, ("partial", "drain"))  # resubmit: vLLM only
        check(isinstance(self.stream_every, int) and self.stream_every >= 0, f"{p}.stream_every", self.stream_every,
              "must be an int >= 0")
        check(self.cache_dtype is None or self.cache_dtype in CACHE_DTYPES, f"{p}.cache_dtype", self.cache_dtype,
              f"must be None or one of {CACHE_DTYPES}")
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
            check(self.kv_pages >= self.num_slots, "engine.kv_pages", self.kv_pages,
                  f"must be >= engine.num_slots={self.num_slots} (every decoding sample holds a page; "
                  "raise engine.kv_pages or lower engine.num_slots)")

        k = self.adapter_versions
        check(isinstance(k, int) and not isinstance(k, bool) and k >= 1, "engine.adapter_versions", k,
              "must be an int >= 1 (1: each pushed adapter is merged into the base)")
        if k > 1:
            for ok, needs in ((self.sync_mode == "partial", f"engine.sync_mode=partial, not {self.sync_mode!r}"),
                              (self.page_size == 0, "engine.page_size=0 (the paged engine merges adapters)"),
                              (not self.speculation.enabled, "engine.speculation.when=never")):
                check(ok, "engine.adapter_versions", k, f"> 1 (version-pinned adapters) needs {needs}")
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
