"""A calculator episode played by the runtime's EpisodeEngine over a real JaxEngine
(tests/helpers/episodes.py `play_example`): a turn without a tool call is the final answer, read
from the tokens the engine sampled; a turn with a malformed call gets the tool's error as the
template's tokens and the episode goes on."""

import pytest

from jaxrl_async.engines.base import SamplingParams
from jaxrl_async.models.config import ModelConfig
from jaxrl_async.tasks import build_task
from jaxrl_async.tokenizer import tiny_tokenizer
from tests.helpers.episodes import constant_token_model, play_example

CFG = ModelConfig.tiny()
TOK = tiny_tokenizer()


@pytest.mark.parametrize("pair, reward", [((77, 101), 1.0), ((77, 102), 0.0)])
def test_a_turn_without_a_call_ends_the_episode_and_is_scored_as_the_answer(pair, reward):
    """The engine's greedy turn is "7777" (a model that writes only 7s): 77 * 101 = 7777 is right
    without the tool, 77 * 102 = 7854 is not; either way no call, so no reply and one turn."""
    task = build_task({"name": "calculator", "a_digits": 2, "b_digits": 3, "turn_max_new_tokens": 4})
    (example,) = task.make_examples([pair], "train")
    greedy = SamplingParams(16, temperature=0.0, stop_token_ids=CFG.eos_token_ids)
    prompt, client, result = play_example(constant_token_model(CFG, ord("7")), CFG, TOK, task, example, greedy)
    assert len(client.turns()) == 1 and client.env_tokens == []
    assert client.token_ids == prompt.prompt_ids + TOK.encode("7777")
    assert (result.reward, result.extracted_answer) == (reward, "7777")
    assert result.terms == {"correct": reward, "tool_calls": 0.0, "tool_errors": 0.0}


def test_an_unclosed_call_gets_an_error_reply_in_template_tokens_and_the_model_its_next_turn():
    """A model that writes only backticks: each turn "````" opens a python block it never closes,
    a malformed call the tool answers with an error (the model's mistake: the episode goes on)."""
    task = build_task({"name": "calculator", "num_prompts": 10, "num_test_prompts": 2, "max_turns": 3,
                       "turn_max_new_tokens": 4})
    example = task.examples()[0]
    greedy = SamplingParams(16, temperature=0.0, stop_token_ids=CFG.eos_token_ids)
    prompt, client, result = play_example(constant_token_model(CFG, ord("`")), CFG, TOK, task, example, greedy)
    ticks = TOK.encode("````")
    assert client.turns() == [ticks] * 3
    bridge = "<|im_end|>\n<|im_start|>user\nerror: the call is not closed<|im_end|>\n<|im_start|>assistant\n"
    assert [TOK.decode(e, skip_special_tokens=False) for e in client.env_tokens] == [bridge, bridge]
    assert client.token_ids == prompt.prompt_ids + ticks + client.env_tokens[0] + ticks + client.env_tokens[1] + ticks
    assert client.loss_mask == [0] * len(prompt.prompt_ids) + ([1] * 4 + [0] * len(client.env_tokens[0])) * 2 + [1] * 4
    assert (result.reward, result.extracted_answer) == (0.0, None)
    assert result.terms == {"correct": 0.0, "tool_calls": 3.0, "tool_errors": 3.0}
