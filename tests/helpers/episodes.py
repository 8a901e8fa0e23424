"""Episodes for the tests: scripted turns for an environment's logic, and real ones on the runtime's engine.

- `ScriptedTurnClient` (envs/episode.py `TurnClient`): returns chosen turns (text tokenized, a
  stop token appended), checking that each call extends the recorded sequence (token-in,
  token-out) and recording the environment's tokens as untrained: an episode whose model turns a
  test picks.
- `constant_token_model`: the tiny model with weights set so that greedy sampling writes one
  chosen token at every position: a real engine whose turns a test can predict.
- `play_on_engine`: one episode of a prompt played as training plays it, a request with
  `episode_of` on the runtime's EpisodeEngine (envs/engine.py) over a fresh JaxEngine; the test
  reads what the engine streamed (`PlayedEpisode`: the sequence, its loss mask, the turns, the
  environment's tokens) and the done piece's `EpisodeRecord`.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxrl_async.engines.base import GenerationRequest, SampleOutput, SamplingParams
from jaxrl_async.engines.jax.config import EngineConfig
from jaxrl_async.engines.jax.engine import JaxEngine
from jaxrl_async.envs.engine import EpisodeEngine
from jaxrl_async.envs.episode import EpisodeFault, EpisodeRecord, EpisodeResult, Turn
from jaxrl_async.envs.task import EpisodeContext, EpisodeTask
from jaxrl_async.models.config import ModelConfig
from jaxrl_async.models.transformer import Transformer
from jaxrl_async.tasks.base import Example, Prompt
from jaxrl_async.tokenizer import Tokenizer
from planner.versions import extend_runs


class RecordingClient:
    """The episode's sequence as a client records it, and which tokens were sampled."""

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


@dataclass
class PlayedEpisode:
    """One episode as the runtime's EpisodeEngine streamed it: its pieces and its done piece's record."""

    prompt: Prompt
    pieces: list[SampleOutput]  # in arrival order, the done piece last

    @property
    def record(self) -> EpisodeRecord:
        return self.pieces[-1].episode

    @property
    def result(self) -> EpisodeResult | None:
        return self.record.result

    @property
    def token_ids(self) -> list[int]:
        """The episode's whole sequence: prompt, turns, environment tokens."""
        return list(self.prompt.prompt_ids) + [t for p in self.pieces for t in p.token_ids]

    @property
    def loss_mask(self) -> list[int]:
        """1 for a token the model sampled, 0 for the prompt's and the environment's."""
        return [0] * len(self.prompt.prompt_ids) + [int(p.sampled) for p in self.pieces for _ in p.token_ids]

    @property
    def env_tokens(self) -> list[list[int]]:
        """The environment's tokens before each turn after the first."""
        return [p.token_ids for p in self.pieces if not p.sampled]

    @property
    def versions(self) -> list[list[int]]:
        """Run-length versions of every sampled token."""
        runs: list[list[int]] = []
        for p in self.pieces:
            extend_runs(runs, p.versions)
        return runs

    def turns(self) -> list[list[int]]:
        """Each model turn's sampled tokens (the record's per-turn counts split them)."""
        sampled = [t for p in self.pieces if p.sampled for t in p.token_ids]
        out, at = [], 0
        for n in self.record.turn_tokens:
            out.append(sampled[at:at + n])
            at += n
        return out

    def sent(self) -> list[list[int]]:
        """The tokens each turn was asked to continue: the sequence before its sampled tokens."""
        flagged = [(t, p.sampled) for p in self.pieces for t in p.token_ids]
        seq, out, at = list(self.prompt.prompt_ids), [], 0
        for n in self.record.turn_tokens:
            while at < len(flagged) and not flagged[at][1]:  # the environment's tokens before the turn
                seq.append(flagged[at][0])
                at += 1
            out.append(list(seq))
            seq += [t for t, _ in flagged[at:at + n]]
            at += n
        return out


def play_on_engine(model: Transformer, model_cfg: ModelConfig, tokenizer: Tokenizer, task: EpisodeTask,
                   prompt: Prompt, sampling: SamplingParams, context: int = 512) -> PlayedEpisode:
    """One episode of `prompt` (a request with `episode_of`) on a fresh EpisodeEngine over a one-slot
    JaxEngine of `model`, as training plays it; a task with `aclose` is closed on the same loop."""

    async def main():
        inner = JaxEngine(model, model_cfg, EngineConfig(num_slots=1, max_len=context, min_bucket=8))
        engine = EpisodeEngine(inner, task, EpisodeContext(tokenizer, sampling.stop_token_ids), max_len=context)
        await engine.start()
        try:
            await engine.submit(GenerationRequest("episode", list(prompt.prompt_ids), sampling, episode_of=prompt))
            pieces = []
            async for piece in engine.outputs():
                pieces.append(piece)
                if piece.done:
                    return PlayedEpisode(prompt, pieces)
        finally:
            if hasattr(task, "aclose"):
                await task.aclose()
            await engine.stop()

    return asyncio.run(main())


def play_example(model: Transformer, model_cfg: ModelConfig, tokenizer: Tokenizer, task: EpisodeTask,
                 example: Example, sampling: SamplingParams) -> tuple[Prompt, PlayedEpisode, EpisodeResult]:
    """`play_on_engine` of `example`'s prompt, an episode that runs to its end: (prompt, played, result)."""
    prompt = task.encoder(tokenizer, tokenizer.chat_template)(example)
    played = play_on_engine(model, model_cfg, tokenizer, task, prompt, sampling)
    assert played.record.fault is None, played.record.fault
    return prompt, played, played.result
