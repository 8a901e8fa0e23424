"""`engine=vllm`'s keys: `VllmEngineConfig`, how the vLLM engine (engine.py) is started and fed.

A config module imports nothing heavy (no vLLM, torch, JAX or ray: tests/test_layers.py holds
it), so typing a run's config and `--help` never load a backend; the transports and the
speculation mapping it checks against are plain Python too.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from jaxrl_async.engines.speculation import SpeculationConfig
from jaxrl_async.engines.vllm.convert import max_lora_rank, speculative_config
from jaxrl_async.transports import TRANSPORTS, check_transport_options
from planner.configs import check
from planner.types import check_sync_mode

SYNC_MODES = ("partial", "resubmit", "drain")  # every weight-sync mode (planner/types.py SYNC_MODES)


@dataclass(frozen=True)
class VllmEngineConfig:
    """`conf/engine/vllm.yaml` (keys under `engine.`).

    Attributes:
      sync_mode: how an update treats in-flight requests: partial | resubmit | drain (SYNC_MODES;
        engines/vllm/engine.py's module docstring).
      recompute_kv: partial mode: drop the paused requests' KV and recompute it on the new weights.
      transport: weight transport name (jaxrl_async.transports.TRANSPORTS).
      transport_options: keyword options of the transport (disk: directory, keep; nccl: master_port).
      model_dir: where the initial HF checkpoint is written for vLLM to load; None = a temp dir.
      max_num_seqs: most sequences vLLM decodes at once (the engine's slots).
      max_model_len: prompt + generation limit.
      kv_cache_memory_bytes: KV cache size; required on CPU (vLLM's RAM share otherwise), None on
        GPU to use gpu_memory_utilization.
      gpu_memory_utilization: GPU memory share vLLM may take (weights + KV).
      tensor_parallel_size: GPUs per engine.
      enforce_eager: skip CUDA graphs / torch.compile (start-up in seconds, slower decode).
      seed: vLLM's global seed.
      speculation: `engine.speculation.*`, mapped onto vLLM's `speculative_config`
        (convert.speculative_config: when=always only; max_active -> vLLM's batch-size schedule).
      engine_args: any other `AsyncEngineArgs` field, passed through.
      adapter_rank: the rank of the LoRA adapters the run pushes, set by the run from
        `trainer.lora.rank` (job/setup.py via the registry's `serve_adapters`), not by hand; 0: no
        adapters. With it vLLM starts with `enable_lora` and every push is one more adapter
        (`LoRARequest`): the sync mode is `pinned` and sync_mode / recompute_kv / transport do not act.
      adapter_versions: adapters vLLM holds at once (its `max_loras`); None: the run's
        max_staleness + 1 (every version an in-flight request may still be pinned to), at most
        max_num_seqs (the distinct versions of the sequences decoded at once), or 1 outside a run.
    """

    name: ClassVar[str] = "vllm"  # `engine.name`: its entry in engines/registry.py

    sync_mode: str = "partial"
    recompute_kv: bool = True
    transport: str = "memory"
    transport_options: dict = field(default_factory=dict)
    model_dir: str | None = None
    max_num_seqs: int = 32
    max_model_len: int = 1024
    kv_cache_memory_bytes: int | None = 256 << 20
    gpu_memory_utilization: float = 0.5
    tensor_parallel_size: int = 1
    enforce_eager: bool = True
    seed: int = 0
    speculation: SpeculationConfig = field(default_factory=SpeculationConfig)
    engine_args: dict = field(default_factory=dict)
    adapter_rank: int = 0
    adapter_versions: int | None = None

    def __post_init__(self) -> None:
        check_sync_mode("engine.sync_mode", self.sync_mode, SYNC_MODES)
        check(self.transport in TRANSPORTS, "engine.transport", self.transport, f"must be one of {sorted(TRANSPORTS)}")
        check_transport_options(self.transport, self.transport_options)
        for name in ("max_num_seqs", "max_model_len", "tensor_parallel_size"):
            check(getattr(self, name) >= 1, f"engine.{name}", getattr(self, name), "must be >= 1")
        check(self.adapter_rank >= 0, "engine.adapter_rank", self.adapter_rank, "must be >= 0 (0: no adapters)")
        if self.adapter_rank:
            max_lora_rank(self.adapter_rank)  # a rank vLLM cannot serve is refused here, naming trainer.lora.rank
        check(self.adapter_versions is None or self.adapter_versions >= 1, "engine.adapter_versions",
              self.adapter_versions, "must be >= 1 (or null: max_staleness + 1)")
        # Refused here, at start-up, not when vLLM starts: when=critical, draft_model=layers:N.
        spec = speculative_config(self.speculation, self.max_num_seqs)
        check(spec is None or "speculative_config" not in self.engine_args, "engine.engine_args.speculative_config",
              self.engine_args.get("speculative_config"), "set engine.speculation.* or this, not both")
