"""The LM head at the loss-masked positions only (`TrainBatch.scored_width`): the same log-probs,
gradients and metrics as the head at every position, for every loss, with chunked logits, with
micro-batches, with a multi-turn mask whose trained tokens are not contiguous; and fewer
temporaries."""

import dataclasses
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_async.trainer.batch import TrainSample, pad_batch, scored_width
from jaxrl_async.trainer.config import TrainerConfig
from jaxrl_async.trainer.step import accumulate_gradients, scored_positions, sequence_logprobs
from tests.helpers.conf_files import options
from tests.jaxrl_async.trainer.test_step import loss_config, max_abs_diff, model

ROWS, SEQ, VOCAB = 8, 32, 264


def make_batch(vocab: int = VOCAB, seq: int = SEQ) -> "TrainBatch":  # noqa: F821
    """Prompts of 8-20 tokens, 2-8 completion tokens (8 in row 1, the width); every third row a two-turn episode whose
    environment reply (mask 0) sits between two trained turns."""
    rng = np.random.default_rng(1)
    samples = []
    for i in range(ROWS):
        prompt = list(rng.integers(0, vocab, rng.integers(8, 21)))
        n = 8 if i == 1 else int(rng.integers(2, 8))
        mask = None if i % 3 else [1] * (n // 2) + [0, 0, 0] + [1] * (n - n // 2)
        completion = list(rng.integers(0, vocab, n if mask is None else len(mask)))
        logprobs = list(-np.log(vocab) + rng.normal(0, 0.3, len(completion)))
        samples.append(TrainSample(prompt, completion, logprobs, float(rng.random()), i // 4, mask))
    return pad_batch(samples, buckets=[seq])


@partial(jax.jit, static_argnames=("graphdef", "cfg"))
def gradients(graphdef, params, batch, cfg):
    return accumulate_gradients(graphdef, params, batch, cfg)


def test_a_batch_scores_a_power_of_two_of_positions_at_least_its_longest_masked_row():
    batch = make_batch()
    counts = (batch.loss_mask > 0).sum(axis=1)
    assert counts.max() == 8 and batch.scored_width == 8  # non-trivial: some row fills the width
    assert scored_width(np.ones((2, 40)), 64) == 0  # as many as the predicted positions: all of them
    assert scored_width(np.ones((2, 9)), 64) == 16
    assert scored_width(np.zeros((2, 64)), 64) == 8


def test_scored_positions_list_every_masked_position_first_in_order_and_distinct():
    mask = jnp.array([[0, 1, 1, 0, 1, 0, 0, 0], [0, 0, 0, 0, 0, 0, 0, 1]], jnp.float32)
    index = np.asarray(scored_positions(mask, 4))
    np.testing.assert_array_equal(index, [[1, 2, 4, 0], [7, 0, 1, 2]])


def test_logprobs_at_every_masked_position_equal_the_head_at_every_position():
    graphdef, params = model(False)
    batch = make_batch()
    assert 0 < batch.scored_width < SEQ - 1
    want = sequence_logprobs(graphdef, params, batch.tokens)
    got = sequence_logprobs(graphdef, params, batch.tokens, scored_mask=batch.loss_mask,
                            scored_width=batch.scored_width)
    masked = batch.loss_mask > 0
    for x, y in zip(got, want):
        assert float(np.abs(np.asarray(y))[masked].min()) > 0.1
        np.testing.assert_allclose(np.asarray(x)[masked], np.asarray(y)[masked], atol=1e-6, rtol=0)


def assert_same_gradient_and_metrics(name: str, chunk: int = 0, microbatches: int = 1):
    graphdef, params = model(False)
    batch = make_batch()
    cfg = dataclasses.replace(loss_config(name), logits_chunk=chunk, num_microbatches=microbatches)
    want_grads, want = gradients(graphdef, params, dataclasses.replace(batch, scored_width=0), cfg)
    grads, metrics = gradients(graphdef, params, batch, cfg)
    for g, w in zip(jax.tree.leaves(grads), jax.tree.leaves(want_grads)):
        scale = float(np.max(np.abs(np.asarray(w))))
        assert scale > 1e-8  # non-trivial: every leaf (head, embedding, norms, layers) has a gradient
        assert float(np.max(np.abs(np.asarray(g) - np.asarray(w)))) <= 1e-5 * scale
    for key in ("loss", "entropy", "pg_loss", "clip_frac", "ratio_max", "is_weight_mean"):
        np.testing.assert_allclose(float(metrics[key]), float(want[key]), rtol=1e-5, atol=1e-7, err_msg=key)
    assert float(want["entropy"]) > 1.0


@pytest.mark.parametrize("name", options("trainer"))
def test_every_loss_has_the_same_gradient_and_metrics_with_the_head_at_the_masked_positions(name):
    assert_same_gradient_and_metrics(name)


@pytest.mark.parametrize("name, chunk, microbatches", [("grpo", 24, 1), ("grpo", 0, 2), ("m2po", 24, 2)])
def test_chunked_logits_and_micro_batches_keep_the_gradient_with_the_head_at_the_masked_positions(
        name, chunk, microbatches):
    assert_same_gradient_and_metrics(name, chunk, microbatches)


def test_the_head_at_the_masked_positions_shrinks_the_step_temporaries():
    """A vocabulary large enough that the logits dominate: 8 rows x 31 positions x 4096 f32 against
    8 x 8, a quarter."""
    graphdef, params = model(False, vocab=4096)
    batch = make_batch(vocab=4096)

    def temp_bytes(b) -> int:
        compiled = gradients.lower(graphdef, params, b, cfg=TrainerConfig()).compile()
        return compiled.memory_analysis().temp_size_in_bytes

    whole, scored = temp_bytes(dataclasses.replace(batch, scored_width=0)), temp_bytes(batch)
    assert scored * 2 < whole, (scored, whole)
