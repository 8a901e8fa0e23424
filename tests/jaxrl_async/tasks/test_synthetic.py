"""The synthetic tasks: repeat_letter's and copy_string's rewards and data, and a random model's start."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_async.models.loading import load_model
from jaxrl_async.tasks import build_task
from jaxrl_async.tasks.synthetic import CopyStringConfig, CopyStringTask, RepeatLetterConfig, RepeatLetterTask
from tests.helpers.tasks import score


@pytest.mark.parametrize("completion, expected", [
    ("cccc", 1.0), ("ccab", 0.5), ("c", 1.0), ("abab", 0.0), ("", 0.0), ("C c", 1 / 3)])
def test_repeat_letter_scores_the_fraction_of_characters_equal_to_the_letter(completion, expected):
    assert score(build_task({"name": "repeat_letter"}), "c", completion) == pytest.approx(expected)


@pytest.mark.parametrize("completion, expected", [
    ("abc", 1.0), ("abcxyz", 1.0), ("abx", 2 / 3), ("ab", 2 / 3), ("bca", 0.0), ("", 0.0)])
def test_copy_string_gives_credit_per_matching_position(completion, expected):
    assert score(build_task({"name": "copy_string"}), "abc", completion) == pytest.approx(expected)


def test_copy_string_data_depends_on_data_seed_only_and_respects_the_lengths():
    def contents(**kw):
        return [e.content for e in build_task({"name": "copy_string", **kw}).examples()]

    assert contents() == contents() != contents(data_seed=1)
    answers = [e.answer for e in build_task({"name": "copy_string", "min_len": 2, "max_len": 3}).examples()]
    assert {len(a) for a in answers} == {2, 3} and set("".join(answers)) <= set("abcdefgh")


def _sample(loaded, prompts, samples, max_new_tokens, seed=0):
    """Temperature-1 samples with the uncached forward: one jitted shape, a short Python loop."""
    rows = [p for p in prompts for _ in range(samples)]
    plen = np.array([len(p.prompt_ids) for p in rows])
    tokens = np.full((len(rows), plen.max() + max_new_tokens), loaded.tokenizer.pad_token_id, np.int32)
    for i, p in enumerate(rows):
        tokens[i, :plen[i]] = p.prompt_ids
    positions = jnp.broadcast_to(jnp.arange(tokens.shape[1]), tokens.shape)
    forward = jax.jit(lambda t: loaded.model(t, positions))
    key = jax.random.PRNGKey(seed)
    for step in range(max_new_tokens):
        logits = forward(jnp.asarray(tokens))[np.arange(len(rows)), plen + step - 1]
        key, sub = jax.random.split(key)
        tokens[np.arange(len(rows)), plen + step] = np.asarray(jax.random.categorical(sub, logits))
    eos = set(loaded.tokenizer.eos_token_ids)
    texts = []
    for i in range(len(rows)):
        completion = [int(t) for t in tokens[i, plen[i]:plen[i] + max_new_tokens]]
        stop = next((j for j, t in enumerate(completion) if t in eos), len(completion))
        texts.append(loaded.tokenizer.decode(completion[:stop]))
    return rows, texts


@pytest.mark.slow
def test_a_random_tiny_model_scores_below_0_2_on_the_synthetic_tasks():
    loaded = load_model("tiny")
    for name in ("repeat_letter", "copy_string"):
        task = build_task({"name": name})
        stream = task.make_stream(loaded.tokenizer, loaded.chat_template, seed=0)
        rows, texts = _sample(loaded, [next(stream) for _ in range(8)], samples=8, max_new_tokens=12)
        rewards = [score(task, p.answer, t) for p, t in zip(rows, texts)]
        assert np.mean(rewards) < 0.2, (name, np.mean(rewards), texts[:4])
        assert sum(map(len, texts)) > 8 * 8 * 4  # the completions are real text, not empty


def test_copy_string_holds_out_strings_that_training_never_shows():
    task = CopyStringTask(CopyStringConfig(num_test_prompts=40))
    train = {e.answer for e in task.examples()}
    test = [e.answer for e in task.test_examples()]
    assert len(test) == 40 == len(set(test)) and not train & set(test)
    assert task.examples() == CopyStringTask(CopyStringConfig(num_test_prompts=3)).examples()  # training data unchanged


def test_copy_string_without_any_string_left_to_hold_out_says_so():
    task = CopyStringTask(CopyStringConfig(alphabet="ab", min_len=1, max_len=1, num_prompts=50))
    with pytest.raises(ValueError, match="no held-out split is left"):
        task.test_examples()


def test_repeat_letter_tests_every_letter_once():
    assert [e.answer for e in RepeatLetterTask(RepeatLetterConfig(alphabet="xyz")).test_examples()] == list("xyz")
