"""EpisodeEngine over the real JAX engine (tiny random model): token-in/token-out, masks, per-turn
versions, and every way an environment step can fail."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest
from flax import nnx

from jaxrl_async.engines.base import GenerationRequest, SamplingParams
from jaxrl_async.engines.jax.config import EngineConfig
from jaxrl_async.engines.jax.engine import JaxEngine
from jaxrl_async.envs.chat import bridge_tokens
from jaxrl_async.envs.engine import EpisodeEngine
from jaxrl_async.envs.task import EpisodeContext
from jaxrl_async.models.config import ModelConfig
from jaxrl_async.models.transformer import Transformer
from jaxrl_async.tokenizer import tiny_tokenizer
from tests.helpers.echo_env import echo_task
from tests.helpers.engines import params_of

CFG = ModelConfig.tiny()
TOKENIZER = tiny_tokenizer()
STOPS = (257, 260)
CTX = EpisodeContext(TOKENIZER, STOPS)


@pytest.fixture(scope="module")
def models():
    return Transformer(CFG, rngs=nnx.Rngs(0)), Transformer(CFG, rngs=nnx.Rngs(1))


def task(**keys):
    return echo_task(**{"max_turns": 3, **keys})


def prompt_of(t):
    return t.make_stream(TOKENIZER, TOKENIZER.chat_template, seed=0, shuffle=False).__next__()


async def play(engine, request, n_done):
    """Submit `request` and read the outer stream until `n_done` samples are done: per sample, its pieces."""
    await engine.start()
    await engine.submit(request)
    pieces: dict[int, list] = {}
    done = 0
    async for piece in engine.outputs():
        pieces.setdefault(piece.sample_index, []).append(piece)
        done += piece.done
        if done == n_done:
            break
    return pieces


def episode_request(prompt, n=2, max_new=6, seed=7):
    return GenerationRequest("g.0", list(prompt.prompt_ids), SamplingParams(max_new, seed=seed, n=n,
                                                                            stop_token_ids=STOPS), episode_of=prompt)


def test_an_episode_is_prompt_turns_and_bridges_token_for_token_and_only_model_tokens_are_trained(models):
    t = task()
    prompt = prompt_of(t)

    async def main():
        inner = JaxEngine(models[0], CFG, EngineConfig(num_slots=4, max_len=256, min_bucket=8))
        engine = EpisodeEngine(inner, t, CTX, max_len=256)
        pieces = await play(engine, episode_request(prompt), 2)
        await engine.stop()
        return pieces

    pieces = asyncio.run(main())
    for sample, ps in pieces.items():
        record = ps[-1].episode
        assert record.fault is None and len(record.turns) == 3  # three model turns, two environment replies
        sampled = [t for p in ps if p.sampled for t in p.token_ids]
        env = [p.token_ids for p in ps if not p.sampled]
        assert len(env) == 2 and sum(record.turn_tokens) == len(sampled) > 0
        assert all(p.versions == [] and p.logprobs == [0.0] * len(p.token_ids) for p in ps if not p.sampled)
        # Rebuild the episode from its messages: every bridge is the template's own rendering of the
        # reply around the turn, tokenized alone (nothing earlier is tokenized again).
        messages = record.result.messages
        turn_ids, at = [], 0
        for count in record.turn_tokens:
            turn_ids.append(sampled[at:at + count])
            at += count
        want = list(prompt.prompt_ids) + turn_ids[0]
        for k in range(2):
            history = messages[: 2 + 2 * k]
            assert history[-1]["role"] == "assistant"
            want += bridge_tokens(TOKENIZER, history, [messages[2 + 2 * k]], turn_ids[k], STOPS) + turn_ids[k + 1]
            assert messages[2 + 2 * k] == {"role": "tool", "content": f"turn {k}"}
        got = list(prompt.prompt_ids) + [t for p in ps for t in p.token_ids]
        assert got == want
        assert record.result.reward == 1.0


def test_each_turn_samples_what_the_engine_samples_for_the_same_request(models):
    """Token-in/token-out: turn k of an episode is the engine's own sample of the episode's tokens so far."""
    t = task(max_turns=2)
    prompt = prompt_of(t)

    async def main():
        inner = JaxEngine(models[0], CFG, EngineConfig(num_slots=4, max_len=256, min_bucket=8))
        engine = EpisodeEngine(inner, t, CTX, max_len=256)
        pieces = await play(engine, episode_request(prompt, n=1), 1)
        ps = pieces[0]
        record = ps[-1].episode
        first = record.turn_tokens[0]
        tokens = [t for p in ps for t in p.token_ids]
        history = list(prompt.prompt_ids) + tokens[: len(tokens) - record.turn_tokens[1]]
        from jaxrl_async.envs.engine import turn_seed
        again = GenerationRequest("again", history, SamplingParams(6, seed=turn_seed(7, 0, 1), stop_token_ids=STOPS))
        await engine.submit(again)  # not an episode: it passes through to the inner engine
        direct = []
        async for piece in engine.outputs():
            if piece.request_id == "again":
                direct += piece.token_ids
                if piece.done:
                    break
        await engine.stop()
        return tokens, record, direct, first

    tokens, record, direct, first = asyncio.run(main())
    assert first > 0 and record.turn_tokens[1] > 0
    assert tokens[-record.turn_tokens[1]:] == direct


def test_a_turn_that_starts_after_a_weight_update_samples_on_the_new_version(models):
    t = task(max_turns=3)
    prompt = prompt_of(t)

    async def main():
        inner = JaxEngine(models[0], CFG, EngineConfig(num_slots=4, max_len=256, min_bucket=8))
        engine = EpisodeEngine(inner, t, CTX, max_len=256)
        original = t.step
        pushed = asyncio.Event()

        async def step_after_push(state, messages):
            if state["steps"] == 0:
                await engine.update_weights(params_of(models[1]), 1)
                pushed.set()
            return await original(state, messages)

        t.step = step_after_push
        pieces = await play(engine, episode_request(prompt, n=1), 1)
        await engine.stop()
        return pieces[0]

    ps = asyncio.run(main())
    record = ps[-1].episode
    versions = [r for p in ps if p.sampled for r in p.versions]
    first_turn = [v for v, c in versions for _ in range(c)][: record.turn_tokens[0]]
    later = [v for v, c in versions for _ in range(c)][record.turn_tokens[0]:]
    assert set(first_turn) == {0} and later and set(later) == {1}


@pytest.mark.parametrize("fault,kind", [("raise", "env_error"), ("hang", "env_timeout"), ("bad", "env_bad_reply"),
                                        ("long", "too_long")])
def test_a_failing_environment_step_ends_its_episode_with_a_fault_and_no_reward(models, fault, kind):
    t = task(fault=fault, fault_at_turn=0, env_timeout_s=0.5)
    prompt = prompt_of(t)

    async def main():
        inner = JaxEngine(models[0], CFG, EngineConfig(num_slots=4, max_len=256, min_bucket=8))
        engine = EpisodeEngine(inner, t, CTX, max_len=256)
        pieces = await play(engine, episode_request(prompt, n=2), 2)
        await engine.stop()
        return pieces

    pieces = asyncio.run(main())
    for ps in pieces.values():
        record = ps[-1].episode
        assert record.fault_kind == kind and record.result is None, record.fault
        assert "\n" not in record.fault
        assert sum(p.done for p in ps) == 1


def test_a_sync_step_that_hangs_times_out_without_blocking_the_run(models):
    t = task(sync_hang=True, env_timeout_s=0.5)
    prompt = prompt_of(t)

    async def main():
        inner = JaxEngine(models[0], CFG, EngineConfig(num_slots=4, max_len=256, min_bucket=8))
        engine = EpisodeEngine(inner, t, CTX, max_len=256)
        pieces = await asyncio.wait_for(play(engine, episode_request(prompt, n=1), 1), 20)
        await engine.stop()
        return pieces

    assert asyncio.run(main())[0][-1].episode.fault_kind == "env_timeout"


def test_tokens_that_do_not_extend_the_episode_are_a_prefix_mismatch(models):
    t = task(max_turns=2)
    prompt = prompt_of(t)

    async def retokenized(prompt, client, ctx):
        turn = await client.generate(list(prompt.prompt_ids))
        ids = list(prompt.prompt_ids) + turn.token_ids
        ids[len(prompt.prompt_ids)] = (ids[len(prompt.prompt_ids)] + 1) % 256  # the sampled text, changed
        await client.generate(ids + [10])

    t.run_episode = retokenized

    async def main():
        inner = JaxEngine(models[0], CFG, EngineConfig(num_slots=4, max_len=256, min_bucket=8))
        engine = EpisodeEngine(inner, t, CTX, max_len=256)
        pieces = await play(engine, episode_request(prompt, n=1), 1)
        await engine.stop()
        return pieces

    record = asyncio.run(main())[0][-1].episode
    assert record.fault_kind == "prefix_mismatch"


def test_aborting_an_episode_request_ends_each_episode_once_as_aborted(models):
    t = task(fault="hang", env_timeout_s=60)
    prompt = prompt_of(t)

    async def main():
        inner = JaxEngine(models[0], CFG, EngineConfig(num_slots=4, max_len=256, min_bucket=8))
        engine = EpisodeEngine(inner, t, CTX, max_len=256)
        await engine.start()
        await engine.submit(episode_request(prompt, n=2))
        pieces = []
        async for piece in engine.outputs():
            pieces.append(piece)
            if piece.token_ids and piece.sampled:
                await engine.abort("g.0")
            if sum(p.done for p in pieces) == 2:
                break
        await engine.stop()
        return pieces

    pieces = asyncio.run(main())
    done = [p for p in pieces if p.done]
    assert sorted(p.sample_index for p in done) == [0, 1] and {p.finish_reason for p in done} == {"abort"}
