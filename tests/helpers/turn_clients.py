"""A real `TurnClient` (envs/episode.py) over a real engine, for the tests of tasks that play episodes.

The runtime's own client is the episode engine's (envs/engine.py, `EpisodeEngine`); this one
keeps the same contract with nothing else, so a task's tests need no runtime: each `generate`
checks that the token ids extend the episode's sequence (a re-tokenized prefix is a
`prefix_mismatch` fault), records the environment's tokens since as untrained, samples the turn
on the engine and returns it. One episode at a time per engine: it reads the engine's one output
stream until its own request is done.
"""

from __future__ import annotations

import itertools

from jaxrl_async.engines.base import GenerationEngine, GenerationRequest, SamplingParams, join_outputs
from jaxrl_async.envs.episode import EpisodeFault, Turn

_ids = itertools.count()


class EngineTurnClient:
    """One episode's turns on `engine`, starting from `prompt_ids`.

    Attributes:
      token_ids: the episode's sequence so far (prompt, turns, environment tokens).
      trained: per token of `token_ids`, whether the model sampled it.
      sent: the token ids of each `generate` call, as the caller sent them.
    """

    def __init__(self, engine: GenerationEngine, prompt_ids: list[int], *, max_len: int, max_new_tokens: int,
                 stop_token_ids: tuple[int, ...], seed: int = 0) -> None:
        self.engine, self.max_len, self.max_new_tokens = engine, max_len, max_new_tokens
        self.stop_token_ids, self.seed = stop_token_ids, seed
        self.token_ids = list(prompt_ids)
        self.trained = [False] * len(prompt_ids)
        self.sent: list[list[int]] = []

    async def generate(self, token_ids: list[int], *, max_new_tokens: int | None = None) -> Turn:
        self.sent.append(list(token_ids))
        if token_ids[:len(self.token_ids)] != self.token_ids:
            raise EpisodeFault("prefix_mismatch", "the turn's tokens do not extend the episode's sequence")
        room = self.max_len - len(token_ids)
        if room < 1:
            raise EpisodeFault("too_long", f"{len(token_ids)} tokens leave no room in max_len={self.max_len}")
        new = token_ids[len(self.token_ids):]
        self.token_ids += new
        self.trained += [False] * len(new)
        limit = min(max_new_tokens or self.max_new_tokens, self.max_new_tokens, room)
        request = GenerationRequest(f"turn-{next(_ids)}", list(token_ids),
                                    SamplingParams(limit, stop_token_ids=self.stop_token_ids, seed=self.seed))
        await self.engine.submit(request)
        pieces = []
        async for out in self.engine.outputs():
            if out.request_id == request.request_id:
                pieces.append(out)
                if out.done:
                    break
        out = join_outputs(pieces)
        self.token_ids += out.token_ids
        self.trained += [True] * len(out.token_ids)
        return Turn(list(out.token_ids), list(out.logprobs), [list(v) for v in out.versions], out.finish_reason)
