"""Decoder LMs (Llama / Qwen2 / Qwen3) in Flax NNX: config, model, loading and saving."""

from jaxrl_async.models.config import ModelConfig
from jaxrl_async.models.hf_weights import save_hf, to_hf_state_dict
from jaxrl_async.models.loading import MODELS, LoadedModel, load_model
from jaxrl_async.models.transformer import KVCache, Transformer, init_cache

__all__ = ["MODELS", "KVCache", "LoadedModel", "ModelConfig", "Transformer", "init_cache",
           "load_model", "save_hf", "to_hf_state_dict"]
