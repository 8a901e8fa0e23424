"""task=verifiers: a verifiers 0.4 environment (examples/verifiers_envs/guess_digit.py) run unchanged."""

import asyncio
import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("verifiers", reason='task=verifiers needs verifiers: pip install -e ".[envs]"')

from flax import nnx  # noqa: E402

from jaxrl_async.engines.base import SamplingParams  # noqa: E402
from jaxrl_async.envs.episode import EpisodeFault, Turn  # noqa: E402
from jaxrl_async.envs.task import EpisodeContext  # noqa: E402
from jaxrl_async.models.config import ModelConfig  # noqa: E402
from jaxrl_async.models.transformer import Transformer  # noqa: E402
from jaxrl_async.tasks import build_task  # noqa: E402
from jaxrl_async.tasks.verifiers_env import LoadFault  # noqa: E402
from jaxrl_async.tokenizer import tiny_tokenizer  # noqa: E402
from tests.helpers import REPO  # noqa: E402
from jaxrl_async.job.setup import typed_config  # noqa: E402
from tests.helpers.train_runs import QUIET, compose_train  # noqa: E402
from tests.helpers.episodes import constant_token_model, play_on_engine  # noqa: E402

TOK = tiny_tokenizer()
EXAMPLE_ENVS = REPO / "examples" / "verifiers_envs"
CTX = EpisodeContext(TOK, TOK.eos_token_ids)


@pytest.fixture(scope="module")
def renderer_dir(tmp_path_factory):
    return TOK.save_hf_dir(tmp_path_factory.mktemp("tiny_tokenizer"))


@pytest.fixture(autouse=True)
def example_envs(monkeypatch):
    monkeypatch.syspath_prepend(str(EXAMPLE_ENVS))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def guess_digit(**keys):
    """The example env; verifiers renders with the run's tokenizer (task.renderer_model "") unless `keys` say."""
    return build_task({"name": "verifiers", "env": "guess_digit", **keys})


class SecretClient:
    """A hand-written TurnClient (the fake for the reward's cases): answers `digits` in turn, each
    with the stop token; checks each call extends what it returned."""

    def __init__(self, prompt_ids, digits):
        self.seq, self.digits = list(prompt_ids), list(digits)

    async def generate(self, token_ids, *, max_new_tokens=None):
        assert token_ids[:len(self.seq)] == self.seq
        out = TOK.encode(str(self.digits.pop(0)), add_bos=False) + [TOK.eos_token_ids[-1]]
        self.seq = list(token_ids) + out
        return Turn(out, [-0.1] * len(out), [[0, len(out)]], "stop")


def play(task, prompt, client):
    async def main():
        try:
            return await task.run_episode(prompt, client, CTX)
        finally:
            await task.aclose()

    return asyncio.run(main())


def test_prompts_are_verifiers_first_turn_rendered_and_the_held_out_split_is_its_own_taskset(renderer_dir):
    task = guess_digit()
    train, test = task.examples(), task.test_examples()
    assert (len(train), len(test)) == (36, 4)  # the default: the last 10% of the 40 rows held out
    prompt = task.encoder(TOK, None)(train[0])
    system = "You play a guessing game. Answer with one digit only."
    want = TOK.apply_chat_template([{"role": "system", "content": system},
                                    {"role": "user", "content": "Guess my digit (0-9)."}], add_generation_prompt=True)
    assert prompt.prompt_ids == TOK.encode(want, add_bos=False)
    named = guess_digit(renderer_model=str(renderer_dir), renderer={"name": "default"})  # a HF directory of its own
    assert named.encoder(TOK, None)(named.examples()[0]).prompt_ids == prompt.prompt_ids
    retemplated = guess_digit()  # the run's chat_template, when it sets one, is the renderer's too
    assert retemplated.encoder(TOK, "Chat:" + TOK.chat_template)(train[0]).text.startswith("Chat:<|im_start|>system")
    split = guess_digit(test_env_args={"split": "test"})
    assert len(split.examples()) == 40 and len(split.test_examples()) == 40
    assert {e.prompt_id for e in split.test_examples()}.isdisjoint(e.prompt_id for e in split.examples())


def test_a_multi_turn_key_the_library_replaces_is_one_warning(caplog):
    guess_digit(max_turns=2, env_workers=16)
    assert [r.getMessage().split(" has")[0] for r in caplog.records if r.levelname == "WARNING"] == ["task.max_turns"]


def test_env_args_come_from_the_command_line_as_one_mapping():
    setup = typed_config(compose_train(["task=verifiers", "task.env=guess_digit", "task.env_args={num_tasks:5}"]))
    task = build_task(setup.task)
    assert len(task.examples()) + len(task.test_examples()) == 5


def test_the_reward_and_its_terms_are_the_librarys():
    task = guess_digit()
    prompt = task.encoder(TOK, None)(task.examples()[0])
    secret = task._split_tasks("train")[0].data.secret
    right = play(task, prompt, SecretClient(prompt.prompt_ids, [secret]))
    assert (right.reward, right.terms) == (1.0, {"found": 1.0, "guessed_first": 1.0})
    assert right.info["generate_calls"] == 1 and right.messages[-1] == {"role": "assistant", "content": str(secret)}
    wrong = (secret + 1) % 10
    late = play(task, prompt, SecretClient(prompt.prompt_ids, [wrong, secret]))
    assert (late.reward, late.terms) == (1.0, {"found": 1.0, "guessed_first": 0.0})
    hint = "higher" if secret > wrong else "lower"
    assert late.messages[3] == {"role": "user", "content": f"{hint}. Guess again."}
    never = play(task, prompt, SecretClient(prompt.prompt_ids, [wrong] * 3))
    assert (never.reward, never.info["generate_calls"]) == (0.0, 3)


CFG = ModelConfig.tiny()


def on_the_engine(task, prompt, model, sampling):
    """One episode of `prompt` on the runtime's EpisodeEngine over a JaxEngine of the tiny `model`,
    as training plays it (tests/helpers/episodes.py `play_on_engine`): what the engine streamed."""
    return play_on_engine(model, CFG, TOK, task, prompt, SamplingParams(16, stop_token_ids=TOK.eos_token_ids, **sampling))


def test_a_held_out_prompt_plays_on_the_held_out_taskset():
    task = guess_digit(test_env_args={"split": "test"})
    prompt = task.encoder(TOK, None)(task.test_examples()[2])
    row = task._split_tasks("test")[2]
    assert row.data.id == "guess_digit-test-2"  # the row the test taskset (split: test) yields
    secret = row.data.secret
    assert play(task, prompt, SecretClient(prompt.prompt_ids, [secret])).reward == 1.0


def test_an_episode_on_the_jax_engine_trains_exactly_the_tokens_verifiers_sent():
    # Turns of "333" (a model that writes only 3s, length-cut: verifiers renders the conversation
    # again); digits are text, so every turn verifiers sends extends the last (random bytes: below).
    task = guess_digit(turn_max_new_tokens=3)
    prompt = task.encoder(TOK, None)(task.examples()[1])
    played = on_the_engine(task, prompt, constant_token_model(CFG, ord("3")), {"temperature": 0.0})
    result, sent = played.result, played.sent()
    assert played.record.fault is None, played.record.fault
    assert sent[0] == prompt.prompt_ids  # verifiers' first turn is the prompt, token for token
    for before, after in zip(sent, sent[1:]):
        assert after[:len(before)] == before and len(after) > len(before)  # every turn extends the last
    assert result.info["generate_calls"] == len(sent) == sum(m["role"] == "assistant" for m in result.messages)
    # each turn's sampled tokens, as the engine streamed them, are the model's turns in verifiers' messages
    turns = played.turns()
    replies = [m["content"] for m in result.messages if m["role"] == "assistant"]
    assert [TOK.decode([t for t in ids if t not in TOK.eos_token_ids]) for ids in turns] == replies
    secret = task._split_tasks("train")[1].data.secret
    guesses = [next((int(c) for c in r if c.isdigit()), None) for r in replies]
    assert result.reward == float(secret in guesses) == result.terms["found"]
    assert len(replies) == 3 or secret in guesses


def test_a_turn_verifiers_tokenizes_again_differently_is_a_prefix_mismatch_never_trained():
    # seed 0 samples bytes that are not UTF-8 in a length-cut turn: verifiers cannot bridge a turn
    # without its stop token, renders the decoded text again, and the bytes come back otherwise.
    task = guess_digit(turn_max_new_tokens=3)
    prompt = task.encoder(TOK, None)(task.examples()[1])
    played = on_the_engine(task, prompt, Transformer(CFG, rngs=nnx.Rngs(0)), {"seed": 0})
    assert played.record.fault_kind == "prefix_mismatch" and played.result is None and played.record.turn_tokens == [3]
    # the mismatching call was refused: nothing after the sampled turns was streamed, so nothing
    # verifiers re-rendered reaches training (the faulted episode is left out of the loss)
    assert played.token_ids == played.sent()[-1] + played.turns()[-1] and all(p.sampled for p in played.pieces)


def test_a_turn_the_client_refuses_ends_the_episode_with_that_fault():
    task = guess_digit()
    prompt = task.encoder(TOK, None)(task.examples()[0])

    class Full:
        async def generate(self, token_ids, *, max_new_tokens=None):
            raise EpisodeFault("too_long", "no room")

    with pytest.raises(EpisodeFault) as fault:
        play(task, prompt, Full())
    assert fault.value.kind == "too_long"


def test_a_turn_the_engine_gives_up_aborts_the_episode():
    task = guess_digit()
    prompt = task.encoder(TOK, None)(task.examples()[0])

    class GivenUp:
        async def generate(self, token_ids, *, max_new_tokens=None):
            raise asyncio.CancelledError  # what the episode engine's client raises for an aborted turn

    with pytest.raises(asyncio.CancelledError):
        play(task, prompt, GivenUp())


def write_module(path, name, source):
    (path / f"{name}.py").write_text(textwrap.dedent(source))


def test_an_environment_that_raises_in_an_episode_is_an_env_error_naming_its_error(tmp_path, monkeypatch):
    write_module(tmp_path, "broken_run", """
        import guess_digit
        from guess_digit import ChatHarness, GuessDigitTaskset

        class BrokenEnv(guess_digit.GuessDigitEnv):
            async def run(self, task, agents):
                raise RuntimeError("the board fell over")

        __all__ = ["BrokenEnv", "ChatHarness", "GuessDigitTaskset"]
        """)
    monkeypatch.syspath_prepend(str(tmp_path))
    task = build_task({"name": "verifiers", "env": "broken_run"})
    prompt = task.encoder(TOK, None)(task.examples()[0])
    with pytest.raises(EpisodeFault) as fault:
        play(task, prompt, SecretClient(prompt.prompt_ids, [1]))
    assert fault.value.kind == "env_error" and "the board fell over" in fault.value.reason


def test_bad_environments_are_one_line_load_errors_naming_the_key(tmp_path, monkeypatch):
    write_module(tmp_path, "raises_at_import", 'raise RuntimeError("no GPU here")\n')
    monkeypatch.syspath_prepend(str(tmp_path))
    cases = [
        ("env", "no_such_env", "load_error: task.env='no_such_env': no module named 'no_such_env'"),
        ("env", "raises_at_import", "load_error: task.env='raises_at_import': the environment raised at load: "
                                    "RuntimeError: no GPU here"),
        ("env_args", {"num_taks": 3}, "load_error: task.env_args.num_taks: Extra inputs are not permitted"),
        ("env_args", {"max_turns": "many"}, "load_error: task.env_args.max_turns: Input should be a valid integer"),
        ("env_config", {"playr": {}}, "load_error: task.env_config.playr: Extra inputs are not permitted"),
    ]
    for key, value, want in cases:
        keys = {"env": "guess_digit", key: value}
        with pytest.raises(LoadFault) as error:
            build_task({"name": "verifiers", **keys})
        assert isinstance(error.value, ValueError) and error.value.kind == "load_error"
        assert str(error.value).startswith(want), str(error.value)
        assert "\n" not in str(error.value)


def test_a_missing_environment_module_stops_the_command_in_one_line_before_any_run_dir(tmp_path):
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "HYDRA_FULL_ERROR": "0", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "jaxrl_async.train", *QUIET, f"hydra.run.dir={tmp_path / 'run'}", "task=verifiers",
         "task.env=no_such_env"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.strip()]
    assert errors == ["error: load_error: task.env='no_such_env': no module named 'no_such_env' (install it, or put "
                      "its folder on PYTHONPATH)"], proc.stderr
    assert not (tmp_path / "run").exists()
