"""The attention module's KV cache: a pytree of per-layer arrays in the layout the attention reads."""

import jax
import jax.numpy as jnp

from jaxrl_async.models.attention import KVCache, init_cache
from jaxrl_async.models.config import ModelConfig


def test_cache_is_a_pytree_of_per_layer_arrays_with_keys_transposed():
    cfg = ModelConfig.tiny()
    cache = init_cache(cfg, 3, 7, dtype=jnp.bfloat16)
    assert len(cache.k) == len(cache.v) == cfg.num_layers
    assert cache.k[0].shape == (3, cfg.num_kv_heads, cfg.head_dim, 7)
    assert cache.v[0].shape == (3, cfg.num_kv_heads, 7, cfg.head_dim)
    assert cache.v[1].dtype == jnp.bfloat16
    assert isinstance(jax.tree.map(lambda x: x + 1, cache), KVCache)
