"""Decoder LMs (Llama / Qwen2 / Qwen3) in Flax NNX: config, model, loading and saving."""

from jaxrl_async.models.config import ModelConfig
from jaxrl_async.models.transformer import KVCache, Transformer, init_cache

__all__ = ["KVCache", "ModelConfig", "Transformer", "init_cache"]
