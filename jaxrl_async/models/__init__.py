"""Decoder LMs (Llama / Qwen2 / Qwen3) in Flax NNX: config, model, loading and saving.

The names below are imported on first use (PEP 562), not with the package: `models/config.py`
(`ModelConfig`, `ModelSpec`) imports no JAX, and `--help` reads `ModelSpec` without paying the
seconds JAX and Flax take to import.
"""

import importlib

_HOMES = {
    "ModelConfig": "config", "MODELS": "loading", "LoadedModel": "loading", "load_model": "loading",
    "save_hf": "hf_weights", "to_hf_state_dict": "hf_weights",
    "KVCache": "attention", "Transformer": "transformer", "init_cache": "attention",
}
__all__ = sorted(_HOMES)


def __getattr__(name: str):
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_HOMES[name]}"), name)
