"""The jitted decode loop on its own: on-device stops, and what a stopped slot leaves alone."""

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxrl_async.engines.jax.steps import engine_decode, engine_decode_steps
from jaxrl_async.models.attention import init_cache
from jaxrl_async.models.config import ModelConfig
from jaxrl_async.models.transformer import Transformer, inference_weights

CFG = ModelConfig.tiny()
decode_steps = jax.jit(engine_decode_steps, static_argnums=(0, 1, 2))
decode = jax.jit(engine_decode, static_argnums=0)


def slots(**kw) -> dict:
    """Inputs for 3 greedy slots at positions 0, 2, 5 (the cache holds random keys/values)."""
    s = dict(tokens=np.array([1, 2, 3], np.int32), positions=np.array([0, 2, 5], np.int32),
             seeds=np.zeros(3, np.uint32), sample_index=np.zeros(3, np.int32),
             token_index=np.zeros(3, np.int32), temperature=np.zeros(3, np.float32),
             top_p=np.ones(3, np.float32), top_k=np.zeros(3, np.int32))
    s.update(kw)
    return s


def setup():
    weights = inference_weights(nnx.to_pure_dict(nnx.state(Transformer(CFG, rngs=nnx.Rngs(0)), nnx.Param)))
    cache = init_cache(CFG, 3, 32)
    keys = jax.random.split(jax.random.key(1), 2 * CFG.num_layers)
    cache = cache.replace(k=tuple(jax.random.normal(keys[i], x.shape) for i, x in enumerate(cache.k)),
                          v=tuple(jax.random.normal(keys[-1 - i], x.shape) for i, x in enumerate(cache.v)))
    return weights, cache


def test_the_loop_samples_what_single_steps_sample_and_stopped_slots_leave_the_cache_alone():
    weights, cache = setup()
    s = slots()
    # Reference: 6 single full-length steps for every slot.
    ref_cache, s1, tokens, logprobs = cache, dict(s), [], []
    for _ in range(6):
        ref_cache, t, lp = decode(CFG, weights, ref_cache, *s1.values())
        tokens.append(np.asarray(t))
        logprobs.append(np.asarray(lp))
        s1.update(tokens=t, positions=s1["positions"] + 1, token_index=s1["token_index"] + 1)
    tokens, logprobs = np.stack(tokens, 1), np.stack(logprobs, 1)  # [S, 6]
    # Slot 0 may sample 6 tokens, slot 1 only 2, slot 2 stops at its third token.
    remaining = np.array([6, 2, 6], np.int32)
    stop_ids = np.full((3, 4), -1, np.int32)
    stop_ids[2, 0] = tokens[2, 2]
    assert tokens[2, 2] not in tokens[2, :2]
    new_cache, got, got_lp, count, steps = decode_steps(CFG, 16, 8, weights, cache, *s.values(), remaining,
                                                        stop_ids)
    np.testing.assert_array_equal(count, [6, 2, 3])
    assert int(steps) == 6  # every slot had stopped: the loop ended before k = 8
    for slot in range(3):
        np.testing.assert_array_equal(got[slot, :count[slot]], tokens[slot, :count[slot]])
        np.testing.assert_allclose(got_lp[slot, :count[slot]], logprobs[slot, :count[slot]], atol=1e-5)
    # A stopped slot writes nothing past its last fed position; a running one writes what the
    # single steps wrote.
    for layer in range(CFG.num_layers):
        for slot in range(3):
            start, end = 0, int(s["positions"][slot] + count[slot])
            np.testing.assert_array_equal(new_cache.v[layer][slot, :, end:], cache.v[layer][slot, :, end:])
            np.testing.assert_array_equal(new_cache.k[layer][slot, ..., end:], cache.k[layer][slot, ..., end:])
            np.testing.assert_allclose(new_cache.v[layer][slot, :, start:end],
                                       ref_cache.v[layer][slot, :, start:end], atol=1e-5)


def test_free_slots_with_nothing_remaining_run_no_step_and_write_nothing():
    weights, cache = setup()
    new_cache, _, _, count, steps = decode_steps(CFG, 8, 4, weights, cache, *slots().values(),
                                                 np.zeros(3, np.int32), np.full((3, 4), -1, np.int32))
    assert int(steps) == 0 and not np.any(count)
    for a, b in zip(jax.tree.leaves(new_cache), jax.tree.leaves(cache)):
        np.testing.assert_array_equal(a, b)
