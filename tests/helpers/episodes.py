"""Turn clients for the episode tests (envs/episode.py `TurnClient`), and a model that writes one token.

- `EngineTurnClient`: one episode's turns on a real engine (a JaxEngine): each turn is one engine
  request whose prompt is the episode's whole token sequence so far; it checks that the sequence
  extends what it recorded (token-in, token-out), records the environment's new tokens as
  untrained and the sampled ones as trained. A test helper until the runtime's EpisodeEngine
  (envs/engine.py) serves episodes; it reads the engine's output stream itself, so one client
  drives one engine at a time.
- `ScriptedTurnClient`: returns chosen turns (text tokenized, a stop token appended), recording
  the same way: an episode whose model turns a test picks.
- `constant_token_model`: the tiny model with weights set so that greedy sampling writes one
  chosen token at every position: a real engine whose turns a test can predict.
- `play_on_engine`: one episode of a task's example on a fresh JaxEngine.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools

import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxrl_async.engines.base import GenerationEngine, GenerationRequest, SamplingParams, join_outputs
from jaxrl_async.engines.jax.config import EngineConfig
from jaxrl_async.engines.jax.engine import JaxEngine
from jaxrl_async.envs.episode import EpisodeFault, EpisodeResult, Turn
from jaxrl_async.envs.task import EpisodeContext, EpisodeTask
from jaxrl_async.models.config import ModelConfig
from jaxrl_async.models.transformer import Transformer
from jaxrl_async.tasks.base import Example, Prompt
from jaxrl_async.tokenizer import Tokenizer


class RecordingClient:
    """What both clients share: the episode's sequence as recorded, and which tokens were sampled."""

    def __init__(self, context: int) -> None:
        self.context = context
        self.token_ids: list[int] = []  # the episode's whole sequence: prompt, turns, environment tokens
        self.loss_mask: list[int] = []  # 1 for a sampled token, 0 for the prompt's and the environment's
        self.env_tokens: list[list[int]] = []  # the tokens appended before each turn after the first
        self.turns: list[Turn] = []

    def extend(self, token_ids: list[int], max_new_tokens: int | None) -> int:
        """Record the new (untrained) tokens of `token_ids`; the turn's token budget."""
        recorded = len(self.token_ids)
        if token_ids[:recorded] != self.token_ids:
            raise EpisodeFault("prefix_mismatch", "the sequence does not extend the episode's recorded tokens")
        new = list(token_ids[recorded:])
        if self.turns:
            self.env_tokens.append(new)
        self.token_ids += new
        self.loss_mask += [0] * len(new)
        room = self.context - len(self.token_ids)
        if room < 1:
            raise EpisodeFault("too_long", f"{len(self.token_ids)} tokens leave no room in a context of {self.context}")
        return room if max_new_tokens is None else min(room, max_new_tokens)

    def record(self, turn: Turn) -> Turn:
        self.token_ids += turn.token_ids
        self.loss_mask += [1] * len(turn.token_ids)
        self.turns.append(turn)
        return turn


class EngineTurnClient(RecordingClient):
    """One episode's turns on `engine` (started by the caller), sampled with `sampling` (n=1)."""

    _ids = itertools.count()

    def __init__(self, engine: GenerationEngine, sampling: SamplingParams, context: int) -> None:
        super().__init__(context)
        self.engine, self.sampling = engine, sampling

    async def generate(self, token_ids: list[int], *, max_new_tokens: int | None = None) -> Turn:
        budget = self.extend(token_ids, max_new_tokens or self.sampling.max_new_tokens)
        request_id = f"episode-turn-{next(self._ids)}"
        sampling = dataclasses.replace(self.sampling, max_new_tokens=budget, n=1)
        await self.engine.submit(GenerationRequest(request_id, list(token_ids), sampling))
        pieces = []
        async for out in self.engine.outputs():
            assert out.request_id == request_id, out.request_id  # one client drives the engine
            pieces.append(out)
            if out.done:
                break
        out = join_outputs(pieces)
        return self.record(Turn(out.token_ids, out.logprobs, out.versions, out.finish_reason))


class ScriptedTurnClient(RecordingClient):
    """Turns written by the test: each text tokenized, then `stop_token_id` (None: a length stop)."""

    def __init__(self, tokenizer: Tokenizer, texts: list[str], stop_token_id: int | None, context: int = 4096) -> None:
        super().__init__(context)
        self.tokenizer, self.texts, self.stop_token_id = tokenizer, list(texts), stop_token_id

    async def generate(self, token_ids: list[int], *, max_new_tokens: int | None = None) -> Turn:
        self.extend(token_ids, max_new_tokens)
        ids = self.tokenizer.encode(self.texts.pop(0), add_bos=False)
        ids += [] if self.stop_token_id is None else [self.stop_token_id]
        return self.record(Turn(ids, [0.0] * len(ids), [[0, len(ids)]], "stop" if self.stop_token_id else "length"))


def constant_token_model(cfg: ModelConfig, token_id: int) -> Transformer:
    """A `cfg` model (untied head) whose greedy choice is `token_id` after any prefix.

    The attention and MLP outputs are zeroed, so the last hidden state is the token's embedding;
    every embedding gets the same positive first coordinate and the final norm keeps only that
    coordinate, so the normed state is a positive multiple of e_0 whatever the tokens; the head
    maps e_0 to `token_id` alone.
    """
    assert not cfg.tie_word_embeddings, "the head must be its own matrix"
    model = Transformer(cfg, rngs=nnx.Rngs(0))
    state = nnx.state(model, nnx.Param)
    params = nnx.to_pure_dict(state)
    for name in ("wo", "w_down"):
        params["layers"][name] = jnp.zeros_like(params["layers"][name])
    embed = np.array(params["embed"])
    embed[:, 0] = 1.0
    params["embed"] = embed
    norm = np.zeros_like(params["final_norm"])
    norm[0] = 1.0
    params["final_norm"] = norm
    head = np.zeros_like(params["lm_head"])
    head[0, token_id] = 1.0
    params["lm_head"] = head
    nnx.replace_by_pure_dict(state, {k: v if isinstance(v, dict) else jnp.asarray(v) for k, v in params.items()})
    nnx.update(model, state)
    return model


def play_on_engine(model: Transformer, model_cfg: ModelConfig, tokenizer: Tokenizer, task: EpisodeTask,
                   example: Example, sampling: SamplingParams,
                   context: int = 512) -> tuple[Prompt, EngineTurnClient, EpisodeResult]:
    """One episode of `example` on a fresh one-slot JaxEngine of `model`: (prompt, client, result)."""
    prompt = task.encoder(tokenizer, tokenizer.chat_template)(example)

    async def main():
        engine = JaxEngine(model, model_cfg, EngineConfig(num_slots=1, max_len=context, min_bucket=8))
        await engine.start()
        try:
            client = EngineTurnClient(engine, sampling, context)
            return client, await task.run_episode(prompt, client, EpisodeContext(tokenizer, sampling.stop_token_ids))
        finally:
            await engine.stop()

    return (prompt, *asyncio.run(main()))
