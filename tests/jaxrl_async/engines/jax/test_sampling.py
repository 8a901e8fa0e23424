"""Per-slot sampling: the empirical distribution matches the intended truncated softmax."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_async.engines.jax.sampling import sample, sample_keys, token_logprobs

LOGITS = np.log(np.array([0.4, 0.3, 0.15, 0.1, 0.05], np.float32))
DRAWS = 20_000


def draw(temperature: float, top_p: float, top_k: int) -> np.ndarray:
    """DRAWS tokens from LOGITS, one row per draw, each with its own key."""
    rows = np.broadcast_to(LOGITS, (DRAWS, LOGITS.size))
    keys = sample_keys(jnp.full(DRAWS, 7, jnp.uint32), jnp.zeros(DRAWS, jnp.int32),
                       jnp.arange(DRAWS, dtype=jnp.int32))
    full = lambda x, dt: jnp.full(DRAWS, x, dt)  # noqa: E731
    tokens = jax.jit(sample)(jnp.asarray(rows), keys, full(temperature, jnp.float32),
                             full(top_p, jnp.float32), full(top_k, jnp.int32))
    return np.bincount(np.asarray(tokens), minlength=LOGITS.size) / DRAWS


def expected(temperature: float, keep: int) -> np.ndarray:
    p = np.exp(LOGITS / temperature)
    p[keep:] = 0
    return p / p.sum()


@pytest.mark.parametrize("temperature, top_p, top_k, keep", [
    (1.0, 1.0, 0, 5),    # plain softmax
    (0.5, 1.0, 0, 5),    # sharper
    (1.0, 1.0, 2, 2),    # top-k
    (1.0, 0.8, 0, 3),    # nucleus: 0.4 + 0.3 < 0.8 <= 0.4 + 0.3 + 0.15
    (1.0, 0.8, 2, 2),    # both: the smaller set wins
])
def test_sampled_frequencies_match_the_truncated_tempered_softmax(temperature, top_p, top_k, keep):
    freq = draw(temperature, top_p, top_k)
    np.testing.assert_allclose(freq, expected(temperature, keep), atol=0.015)
    assert freq[keep:].sum() == 0


def test_temperature_zero_is_argmax_whatever_top_p_and_top_k():
    logits = jnp.asarray([[0.0, 3.0, 1.0], [2.0, -1.0, 1.0]])
    keys = sample_keys(jnp.zeros(2, jnp.uint32), jnp.zeros(2, jnp.int32), jnp.zeros(2, jnp.int32))
    tokens = sample(logits, keys, jnp.zeros(2), jnp.asarray([0.1, 1.0]), jnp.asarray([0, 1]))
    assert tokens.tolist() == [1, 0]


def test_mixed_rows_keep_their_own_parameters_in_one_batch():
    logits = jnp.asarray(np.broadcast_to(LOGITS, (3, LOGITS.size)))
    keys = sample_keys(jnp.arange(3, dtype=jnp.uint32), jnp.zeros(3, jnp.int32), jnp.zeros(3, jnp.int32))
    # greedy, top_k=1 (also the argmax) and a plain row; only the first two are determined.
    tokens = sample(logits, keys, jnp.asarray([0.0, 2.0, 1.0]), jnp.ones(3), jnp.asarray([0, 1, 0]))
    assert tokens[:2].tolist() == [0, 0]


def test_logprobs_are_the_raw_log_softmax_of_the_chosen_token():
    logits = jnp.asarray([[1.0, 2.0, 3.0]])
    got = token_logprobs(logits, jnp.asarray([1]))
    np.testing.assert_allclose(got, [2.0 - np.log(np.exp([1.0, 2.0, 3.0]).sum())], rtol=1e-6)
