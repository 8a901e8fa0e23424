"""guess_number episodes played by the runtime's EpisodeEngine over a real JaxEngine
(tests/helpers/episodes.py `play_example`): each turn continues the episode's own tokens, the
environment's reply is streamed as the chat template's tokens, and nothing is tokenized twice."""

import pytest
from flax import nnx

from jaxrl_async.engines.base import SamplingParams
from jaxrl_async.models.config import ModelConfig
from jaxrl_async.models.transformer import Transformer
from jaxrl_async.tasks import build_task
from jaxrl_async.tokenizer import tiny_tokenizer
from tests.helpers.episodes import constant_token_model, play_example

CFG = ModelConfig.tiny()
TOK = tiny_tokenizer()
STOPS = CFG.eos_token_ids


def play(model, task, secret, sampling):
    """One episode of the example whose secret is `secret`: (prompt, the played episode, its result)."""
    example = next(e for e in task.examples() + task.test_examples() if e.answer == secret)
    return play_example(model, CFG, TOK, task, example, sampling)


@pytest.fixture(scope="module")
def sevens():
    """A real model whose greedy turns are "7777" (4 new tokens, cut at the length limit)."""
    return constant_token_model(CFG, ord("7"))


GREEDY = SamplingParams(16, temperature=0.0, stop_token_ids=STOPS)


def test_a_wrong_guess_is_answered_lower_in_template_tokens_until_the_turns_run_out(sevens):
    task = build_task({"name": "guess_number", "lo": 1, "hi": 9999, "num_test_prompts": 1, "max_turns": 3,
                       "turn_max_new_tokens": 4})
    prompt, client, result = play(sevens, task, 5000, GREEDY)
    seven = TOK.encode("7777")
    assert client.turns() == [seven] * 3  # each cut at the turn's limit (no stop token)
    assert client.versions == [[0, 12]]
    # Hand-checked: 7777 > 5000 twice (the third turn is the last: no reply), never found.
    bridge = "<|im_end|>\n<|im_start|>user\nThe number is lower than 7777.<|im_end|>\n<|im_start|>assistant\n"
    assert [TOK.decode(e, skip_special_tokens=False) for e in client.env_tokens] == [bridge, bridge]
    assert client.token_ids == prompt.prompt_ids + seven + client.env_tokens[0] + seven + client.env_tokens[1] + seven
    assert client.loss_mask == ([0] * len(prompt.prompt_ids) + [1] * 4 + [0] * len(client.env_tokens[0]) + [1] * 4
                                + [0] * len(client.env_tokens[1]) + [1] * 4)
    assert (result.reward, result.terms) == (0.0, {"found": 0.0, "guesses": 3.0, "invalid": 0.0})
    assert [m["content"] for m in result.messages[1:]] == ["7777", "The number is lower than 7777."] * 2 + ["7777"]


def test_the_right_first_guess_ends_the_episode_with_reward_one_and_its_turn_bonus(sevens):
    task = build_task({"name": "guess_number", "lo": 1, "hi": 9999, "num_test_prompts": 1, "max_turns": 4,
                       "turn_max_new_tokens": 4, "turn_bonus": 0.4})
    prompt, client, result = play(sevens, task, 7777, GREEDY)
    assert len(client.turns()) == 1 and client.env_tokens == []
    assert client.token_ids == prompt.prompt_ids + TOK.encode("7777")
    assert result.reward == pytest.approx(1.0 + 0.4 * 3 / 4)
    assert result.terms == {"found": 1.0, "guesses": 1.0, "invalid": 0.0} and result.extracted_answer == "7777"


def test_a_sampled_episode_is_its_prompt_turns_and_replies_exactly_and_the_replies_decode_to_the_template():
    """A random model sampled at T=1: whatever it writes, the sequence is the prompt, each turn's
    tokens as sampled and the template's rendering of each reply; its turns end on a stop token
    or at the limit, and only the sampled tokens are in the loss."""
    task = build_task({"name": "guess_number", "num_test_prompts": 1, "max_turns": 4, "turn_max_new_tokens": 12})
    model = Transformer(CFG, rngs=nnx.Rngs(3))
    prompt, client, result = play(model, task, task.examples()[0].answer,
                                  SamplingParams(16, temperature=1.0, seed=0, stop_token_ids=STOPS))
    turns = client.turns()
    assert 1 <= len(turns) <= 4 and len(client.env_tokens) == len(turns) - 1
    ids, mask = list(prompt.prompt_ids), [0] * len(prompt.prompt_ids)
    for turn, env in zip(turns, [*client.env_tokens, []]):
        assert 1 <= len(turn) <= 12
        ids += turn + env
        mask += [1] * len(turn) + [0] * len(env)
    assert all(len(p.logprobs) == len(p.token_ids) for p in client.pieces)
    assert (client.token_ids, client.loss_mask) == (ids, mask)
    replies = result.messages[2::2]
    for turn, env, reply in zip(turns, client.env_tokens, replies):
        end = "\n" if turn[-1] in STOPS else "<|im_end|>\n"
        assert TOK.decode(env, skip_special_tokens=False) == (
            f"{end}<|im_start|>user\n{reply['content']}<|im_end|>\n<|im_start|>assistant\n")
    assert result.terms["guesses"] + result.terms["invalid"] == len(turns)
