"""The guess_number game: higher/lower replies, invalid guesses, the turn limit and the score on
real message lists, the held-out split, and whole episodes whose guesses the test writes."""

import asyncio

import pytest

from jaxrl_async.envs.task import EnvReply, EpisodeContext
from jaxrl_async.tasks import build_task
from jaxrl_async.tokenizer import tiny_tokenizer
from tests.helpers.episodes import ScriptedTurnClient

TOK = tiny_tokenizer()
IM_END = TOK.token_to_id("<|im_end|>")


def game(*turns: str) -> list[dict]:
    """The question, then the turns alternating assistant / environment (role user)."""
    roles = ["assistant", "user"]
    return [{"role": "user", "content": "I am thinking of a number."}] + [
        {"role": roles[i % 2], "content": t} for i, t in enumerate(turns)]


def test_every_secret_is_in_exactly_one_split():
    task = build_task({"name": "guess_number", "lo": 1, "hi": 30, "num_test_prompts": 5})
    train, test = task.split_examples("train"), task.split_examples("test")
    assert len(test) == 5 and len(train) == 25
    assert sorted(e.answer for e in train + test) == list(range(1, 31))
    assert all(e.meta == {"split": "test", "secret": e.answer, "lo": 1, "hi": 30} for e in test)
    assert {e.content for e in train + test} == {task.cfg.prompt.format(lo=1, hi=30)}  # the secret is never told


def test_step_says_higher_or_lower_and_ends_on_the_secret():
    task = build_task({"name": "guess_number"})
    assert task.step(42, game("50")) == EnvReply([{"role": "user", "content": "The number is lower than 50."}])
    assert task.step(42, game("I guess 10")) == EnvReply([{"role": "user", "content": "The number is higher than 10."}])
    assert task.step(42, game("Is it 42?")).done
    assert task.step(42, game("Between 1 and 100, my guess is 41.")).messages[0]["content"].endswith("higher than 41.")


@pytest.mark.parametrize("turn", ["no idea", "101", "0", "-5"])
def test_a_turn_without_a_number_in_range_is_invalid_and_asks_again(turn):
    task = build_task({"name": "guess_number"})
    reply = task.step(42, game(turn))
    assert reply == EnvReply([{"role": "user", "content": "Answer with one number from 1 to 100."}])
    assert task.guess(turn) is None


def test_score_counts_guesses_and_invalid_turns():
    task = build_task({"name": "guess_number"})
    found = task.score_episode(42, game("50", "lower", "hmm", "again", "25", "higher", "42"))
    assert (found.reward, found.terms, found.extracted_answer) == (
        1.0, {"found": 1.0, "guesses": 3.0, "invalid": 1.0}, "42")
    lost = task.score_episode(42, game("50", "lower", "49"))
    assert (lost.reward, lost.terms) == (0.0, {"found": 0.0, "guesses": 2.0, "invalid": 0.0})


def test_the_turn_bonus_rewards_finding_it_sooner():
    task = build_task({"name": "guess_number", "max_turns": 8, "turn_bonus": 0.5})
    assert task.score_episode(42, game("42")).reward == 1.0 + 0.5 * 7 / 8
    assert task.score_episode(42, game(*["1", "higher"] * 7, "42")).reward == 1.0
    assert task.score_episode(42, game("1")).reward == 0.0


def play(task, secret, texts):
    example = next(e for e in task.examples() + task.test_examples() if e.answer == secret)
    prompt = task.encoder(TOK, TOK.chat_template)(example)
    client = ScriptedTurnClient(TOK, texts, IM_END)
    return prompt, client, asyncio.run(task.run_episode(prompt, client, EpisodeContext(TOK, (IM_END,))))


def test_a_binary_search_episode_finds_the_secret_and_scores_one():
    task = build_task({"name": "guess_number", "max_turns": 8})
    prompt, client, result = play(task, 42, ["50", "25", "37", "43", "40", "42", "unused"])
    assert result.reward == 1.0 and result.terms == {"found": 1.0, "guesses": 6.0, "invalid": 0.0}
    assert len(client.turns) == 6 and len(client.env_tokens) == 5  # no reply after the right guess
    assert [m["content"] for m in result.messages[2::2]] == [
        "The number is lower than 50.", "The number is higher than 25.", "The number is higher than 37.",
        "The number is lower than 43.", "The number is higher than 40."]
    ids = list(prompt.prompt_ids)
    for turn, env in zip(client.turns, [*client.env_tokens, []]):
        ids += turn.token_ids + env
    assert client.token_ids == ids


def test_an_episode_that_runs_out_of_turns_scores_zero():
    task = build_task({"name": "guess_number", "max_turns": 3})
    _, client, result = play(task, 42, ["50", "no idea", "41", "unused"])
    assert len(client.turns) == 3
    assert result.reward == 0.0 and result.terms == {"found": 0.0, "guesses": 2.0, "invalid": 1.0}
    assert result.messages[4]["content"] == "Answer with one number from 1 to 100."


@pytest.mark.parametrize("values, field", [
    ({"lo": 5, "hi": 5}, "task.hi"), ({"lo": 1, "hi": 10, "num_test_prompts": 10}, "task.num_test_prompts"),
    ({"turn_bonus": -1.0}, "task.turn_bonus"), ({"env_timeout_s": 0}, "task.env_timeout_s"),
    ({"prompt": "Guess from {lo} to {top}"}, "task.prompt"),
])
def test_bad_settings_name_the_key(values, field):
    with pytest.raises(ValueError, match=field):
        build_task({"name": "guess_number", **values})
