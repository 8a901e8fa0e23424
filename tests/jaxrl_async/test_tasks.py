"""Tasks: the registry and config checks, the synthetic rewards, a random model's start, custom."""

import asyncio
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_async.models.loading import load_model
from jaxrl_async.tasks import TASKS, Prompt, Task, TaskConfig, build_task, register_task


def _score(task, answer, completion):
    prompt = Prompt("p", "", [], answer, {"content": ""})
    result = asyncio.run(task.reward(prompt, completion, []))
    assert result.error is None
    return result.value


def test_every_conf_task_yaml_builds_its_registered_task():
    from jaxrl_async.config_nodes import register_config_nodes
    from tests.helpers.conf_files import composed, options

    register_config_nodes()  # each task file starts from its config's defaults node
    names = set(options("task"))
    assert names == set(TASKS)
    for name in names - {"custom"}:  # custom needs a path, tested below
        cfg = composed("task", name)
        assert cfg["name"] == name and type(build_task(cfg)) is TASKS[name]


def test_an_unknown_key_a_wrong_type_or_an_unknown_task_is_a_one_line_error_naming_it():
    with pytest.raises(ValueError, match=r"task.alphabett: unknown key for task 'repeat_letter'"):
        build_task({"name": "repeat_letter", "alphabett": "ab"})
    with pytest.raises(ValueError, match=r"task.num_prompts='8': must be int"):
        build_task({"name": "repeat_letter", "num_prompts": "8"})
    with pytest.raises(ValueError, match=r"task.max_len=1: must be >= min_len=2"):
        build_task({"name": "copy_string", "max_len": 1})
    with pytest.raises(ValueError, match=r"task.name='nope': not a registered task"):
        build_task({"name": "nope"})


def test_registering_a_second_task_under_a_taken_name_raises():
    class Again(Task):
        name = "repeat_letter"
        config_class = TaskConfig

    with pytest.raises(ValueError, match="registered twice"):
        register_task(Again)


@pytest.mark.parametrize("completion, expected", [
    ("cccc", 1.0), ("ccab", 0.5), ("c", 1.0), ("abab", 0.0), ("", 0.0), ("C c", 1 / 3)])
def test_repeat_letter_scores_the_fraction_of_characters_equal_to_the_letter(completion, expected):
    assert _score(build_task({"name": "repeat_letter"}), "c", completion) == pytest.approx(expected)


@pytest.mark.parametrize("completion, expected", [
    ("abc", 1.0), ("abcxyz", 1.0), ("abx", 2 / 3), ("ab", 2 / 3), ("bca", 0.0), ("", 0.0)])
def test_copy_string_gives_credit_per_matching_position(completion, expected):
    assert _score(build_task({"name": "copy_string"}), "abc", completion) == pytest.approx(expected)


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
        rewards = [_score(task, p.answer, t) for p, t in zip(rows, texts)]
        assert np.mean(rewards) < 0.2, (name, np.mean(rewards), texts[:4])
        assert sum(map(len, texts)) > 8 * 8 * 4  # the completions are real text, not empty


def test_custom_reads_prompts_scores_exact_match_and_needs_a_path(tmp_path):
    path = tmp_path / "mine.jsonl"
    path.write_text('{"prompt": "say hi", "answer": "hi", "lang": "en"}\n\n{"prompt": "no answer"}\n')
    task = build_task({"name": "custom", "path": str(path)})
    examples = task.examples()
    assert [e.prompt_id for e in examples] == ["custom-mine-1", "custom-mine-3"]
    assert examples[0].meta == {"lang": "en"} and examples[1].answer is None
    assert _score(task, "hi", " hi\n") == 1.0 and _score(task, "hi", "hello") == 0.0
    with pytest.raises(ValueError, match="task 'custom' needs a JSONL file"):
        build_task({"name": "custom"})


def test_task_configs_are_frozen():
    task = build_task({"name": "repeat_letter"})
    with pytest.raises(dataclasses.FrozenInstanceError):
        task.cfg.alphabet = "xyz"
