"""The train step's log-probs: chunked logits (`trainer.logits_chunk`) against the whole logits.

Every loss of conf/trainer/ is differentiated both ways on one tiny model and batch (8 rows of 16
tokens: 15 predicted positions per row), with chunks that do and do not divide the positions.
"""

import dataclasses
from functools import cache, partial

import jax
import numpy as np
import pytest
from flax import nnx

from jaxrl_async.cli.config_nodes import register_config_nodes
from jaxrl_async.models.config import ModelConfig
from jaxrl_async.models.transformer import Transformer
from jaxrl_async.trainer.batch import pad_batch
from jaxrl_async.trainer.config import TrainerConfig
from jaxrl_async.trainer.step import accumulate_gradients, chunk_positions, sequence_logprobs
from planner.configs import build
from tests.helpers.conf_files import composed, options

ROWS, SEQ = 8, 16


@cache
def model(tied: bool, vocab: int = 264):
    graphdef, state = nnx.split(Transformer(ModelConfig.tiny(tie_word_embeddings=tied, vocab_size=vocab),
                                            rngs=nnx.Rngs(0)), nnx.Param)
    return graphdef, state.to_pure_dict()


@cache
def loss_config(name: str) -> TrainerConfig:
    register_config_nodes()
    return build(TrainerConfig, composed("trainer", name), "trainer")


def make_batch(seq=SEQ, vocab=264):
    """Rows of 1-4 prompt and 1-11 completion tokens; behaviour log-probs near the model's, with
    enough spread that clips, caps and M2PO's mask are all active."""
    rng = np.random.default_rng(0)
    samples = []
    for i in range(ROWS):
        prompt = list(rng.integers(0, vocab, rng.integers(1, 5)))
        completion = list(rng.integers(0, vocab, rng.integers(1, seq - 4)))
        logprobs = list(-np.log(vocab) + rng.normal(0, 0.3, len(completion)))
        samples.append((prompt, completion, logprobs, float(rng.random()), i // 4))
    return pad_batch(samples, buckets=[seq])


@partial(jax.jit, static_argnames=("graphdef", "cfg"))
def gradients(graphdef, params, batch, cfg):
    return accumulate_gradients(graphdef, params, batch, cfg)


@cache
def whole_logits_gradients(name: str, tied: bool, microbatches: int):
    graphdef, params = model(tied)
    cfg = dataclasses.replace(loss_config(name), num_microbatches=microbatches)
    return gradients(graphdef, params, make_batch(), cfg)


def max_abs_diff(a, b) -> float:
    return max(float(np.max(np.abs(np.asarray(x) - np.asarray(y)))) for x, y in zip(jax.tree.leaves(a),
                                                                                     jax.tree.leaves(b)))


def assert_chunked_equals_whole(name: str, chunk: int, tied: bool = False, microbatches: int = 1):
    graphdef, params = model(tied)
    cfg = dataclasses.replace(loss_config(name), num_microbatches=microbatches, logits_chunk=chunk)
    want_grads, want = whole_logits_gradients(name, tied, microbatches)
    grads, metrics = gradients(graphdef, params, make_batch(), cfg)
    # Non-trivial: every leaf (head, embedding, norms, layers) has a gradient.
    assert min(float(np.max(np.abs(np.asarray(g)))) for g in jax.tree.leaves(want_grads)) > 1e-6
    assert max_abs_diff(grads, want_grads) <= 1e-6
    for key in ("loss", "entropy", "pg_loss", "clip_frac", "ratio_max", "is_weight_mean"):
        np.testing.assert_allclose(float(metrics[key]), float(want[key]), rtol=1e-5, atol=1e-6, err_msg=key)
    assert float(want["entropy"]) > 1.0


@pytest.mark.parametrize("name", options("trainer"))
def test_every_loss_has_the_whole_logits_gradient_with_a_padded_tail_chunk(name):
    # 64 tokens over 8 rows: chunks of 8 positions, so 15 = 8 + 7 and the tail chunk is padded.
    assert chunk_positions(ROWS, SEQ - 1, 64) == 8
    assert_chunked_equals_whole(name, 64)


@pytest.mark.parametrize("chunk, positions", [(40, 5), (8, 1), (3, 1), (10_000, 15)])
def test_chunks_that_divide_the_positions_or_hold_them_all_give_the_same_gradient(chunk, positions):
    assert chunk_positions(ROWS, SEQ - 1, chunk) == positions
    assert_chunked_equals_whole("grpo", chunk)


@pytest.mark.parametrize("chunk", [64, 40])
def test_tied_embeddings_get_the_same_gradient_through_the_chunked_head(chunk):
    assert "lm_head" not in model(True)[1]
    assert_chunked_equals_whole("grpo", chunk, tied=True)


def test_m2po_over_micro_batches_uses_chunks_for_its_whole_batch_forward_too():
    # Micro-batches of 4 rows: 24 tokens are 6 positions, so 15 = 6 + 6 + 3.
    assert chunk_positions(ROWS // 2, SEQ - 1, 24) == 6
    assert_chunked_equals_whole("m2po", 24, microbatches=2)


@pytest.mark.parametrize("dtype, atol", [("float32", 1e-6), ("bfloat16", 1e-5)])
def test_chunked_logprobs_and_entropy_equal_the_whole_logits(dtype, atol):
    graphdef, params = model(False)
    tokens = make_batch().tokens
    want = sequence_logprobs(graphdef, params, tokens, dtype)
    got = sequence_logprobs(graphdef, params, tokens, dtype, logits_chunk=64)
    for x, y in zip(got, want):
        assert x.shape == (ROWS, SEQ) and float(np.abs(y).min(initial=1.0, where=np.arange(SEQ) > 0)) > 0.1
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), atol=atol, rtol=0)


def test_chunked_logits_shrink_the_compiled_step_temporaries():
    """A vocabulary large enough that the logits dominate: 8 x 64 tokens x 4096 f32 logits are 8 MiB
    an array, chunks of 64 tokens 1 MiB. Chunks cut the temporaries 4.5x here; without
    `jax.checkpoint` on the chunk the map would save every chunk's softmax (2.4x)."""
    graphdef, params = model(False, vocab=4096)
    batch = make_batch(seq=64, vocab=4096)

    def temp_bytes(chunk: int) -> int:
        cfg = TrainerConfig(logits_chunk=chunk)
        compiled = gradients.lower(graphdef, params, batch, cfg=cfg).compile()
        return compiled.memory_analysis().temp_size_in_bytes

    whole, chunked = temp_bytes(0), temp_bytes(64)
    assert chunked * 3 < whole, (chunked, whole)
