"""Multi-turn tasks: `EpisodeTask` (the contract) and `ChatEnvTask` (an environment's turn loop).

`EpisodeTask.run_episode(prompt, client, ctx)` plays one episode: it calls `client.generate` for
each model turn (token-in, token-out, engine.py) and returns the episode's `EpisodeResult`, its
reward included. A library that drives its own episodes (verifiers) implements it directly; an
environment written as `reset` / `step` / `score_episode` subclasses `ChatEnvTask`, whose loop
renders each reply with the chat template incrementally (chat.py).

Isolation: every environment call runs under `task.env_timeout_s`, at most `task.env_workers` at
once. A call that raises, hangs or returns something that is not a reply ends the episode with an
`EpisodeFault` (episode.py): the episode is recorded and counted, never given a made-up reward.
A plain (sync) environment function runs in a worker thread, so a hang never blocks the run; a
hung thread is abandoned at the timeout.
"""

from __future__ import annotations

import abc
import asyncio
import inspect
from dataclasses import dataclass
from typing import Any, ClassVar

from jaxrl_async.envs.chat import assistant_text, bridge_tokens
from jaxrl_async.envs.episode import EpisodeFault, EpisodeResult, TurnClient
from jaxrl_async.tasks.base import Prompt, Task, TaskConfig
from jaxrl_async.tokenizer import Tokenizer
from planner.configs import check


@dataclass(frozen=True, kw_only=True)
class EnvTaskConfig(TaskConfig):
    """Keys of every multi-turn task (on top of TaskConfig's).

    Attributes:
      max_turns: most model turns in one episode; the episode ends after the last one.
      env_timeout_s: seconds one environment call (reset, step, score) may take; past it the
        episode ends with an `env_timeout` fault.
      env_workers: environment calls that run at once, over all episodes.
      turn_max_new_tokens: most tokens one model turn samples; null = the run's max_new_tokens.
    """

    max_turns: int = 4
    env_timeout_s: float = 10.0
    env_workers: int = 16
    turn_max_new_tokens: int | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        check(isinstance(self.max_turns, int) and self.max_turns >= 1, "task.max_turns", self.max_turns,
              "must be an int >= 1")
        check(self.env_timeout_s > 0, "task.env_timeout_s", self.env_timeout_s, "must be > 0 (seconds)")
        check(isinstance(self.env_workers, int) and self.env_workers >= 1, "task.env_workers", self.env_workers,
              "must be an int >= 1")
        check(self.turn_max_new_tokens is None or self.turn_max_new_tokens >= 1, "task.turn_max_new_tokens",
              self.turn_max_new_tokens, "must be null or an int >= 1")


@dataclass(frozen=True)
class EpisodeContext:
    """What an episode needs besides its prompt and client: the tokenizer and the stop tokens."""

    tokenizer: Tokenizer
    stop_token_ids: tuple[int, ...]


@dataclass(frozen=True)
class EnvReply:
    """An environment step's answer: messages to append, and whether the episode ends.

    Attributes:
      messages: chat messages ({"role": ..., "content": str}) the model reads in its next turn.
      done: the episode ends here (the model gets no further turn).
    """

    messages: list[dict[str, Any]]
    done: bool = False


class EpisodeTask(Task):
    """A task whose samples are episodes: `run_episode` replaces `score`."""

    multi_turn: ClassVar[bool] = True
    cfg: EnvTaskConfig

    def __init__(self, cfg: EnvTaskConfig) -> None:
        super().__init__(cfg)
        self._calls: asyncio.Semaphore | None = None  # made on the run's event loop

    @abc.abstractmethod
    async def run_episode(self, prompt: Prompt, client: TurnClient, ctx: EpisodeContext) -> EpisodeResult:
        """Play one episode of `prompt`; raise EpisodeFault when it cannot go on."""

    async def score(self, prompt: Prompt, completion_text: str, completion_ids: list[int]) -> float:
        raise TypeError(f"task {self.name!r} is multi-turn: its samples are scored by run_episode")

    async def env_call(self, what: str, fn: Any, *args: Any) -> Any:
        """`fn(*args)` (sync in a worker thread, or async) under the step timeout and the workers' bound;
        a raise or a hang becomes an EpisodeFault naming `what`."""
        if self._calls is None:
            self._calls = asyncio.Semaphore(self.cfg.env_workers)
        async with self._calls:
            call = fn(*args) if inspect.iscoroutinefunction(fn) else asyncio.to_thread(fn, *args)
            try:
                return await asyncio.wait_for(call, self.cfg.env_timeout_s)
            except TimeoutError:
                raise EpisodeFault("env_timeout", f"{what} took longer than task.env_timeout_s="
                                                  f"{self.cfg.env_timeout_s:g}") from None
            except EpisodeFault:
                raise
            except Exception as e:  # the environment's own code: any error is the episode's fault
                raise EpisodeFault("env_error", f"{what} raised {type(e).__name__}: {e}") from None


class ChatEnvTask(EpisodeTask):
    """An environment over chat messages. Subclasses implement:

    - `reset(prompt) -> state`: the episode's state (anything; default None).
    - `step(state, messages) -> EnvReply`: the environment's answer to the model's last turn
      (`messages[-1]`, role "assistant").
    - `score_episode(state, messages) -> EpisodeResult`: the reward once the episode ended.

    Each may be sync or async; each runs under `env_call`'s timeout.
    """

    def reset(self, prompt: Prompt) -> Any:
        return None

    @abc.abstractmethod
    def step(self, state: Any, messages: list[dict[str, Any]]) -> EnvReply: ...

    @abc.abstractmethod
    def score_episode(self, state: Any, messages: list[dict[str, Any]]) -> EpisodeResult: ...

    def first_messages(self, prompt: Prompt) -> list[dict[str, Any]]:
        """The conversation the prompt's tokens render (the user's question)."""
        return [{"role": "user", "content": prompt.meta["content"]}]

    async def run_episode(self, prompt: Prompt, client: TurnClient, ctx: EpisodeContext) -> EpisodeResult:
        state = await self.env_call("reset", self.reset, prompt)
        messages = self.first_messages(prompt)
        ids = list(prompt.prompt_ids)
        for turn_index in range(self.cfg.max_turns):
            turn = await client.generate(ids, max_new_tokens=self.cfg.turn_max_new_tokens)
            ids += turn.token_ids
            messages.append({"role": "assistant",
                             "content": assistant_text(ctx.tokenizer, turn.token_ids, ctx.stop_token_ids)})
            if turn_index == self.cfg.max_turns - 1:
                break
            reply = await self.env_call("step", self.step, state, messages)
            if not isinstance(reply, EnvReply) or not all(
                    isinstance(m, dict) and isinstance(m.get("content"), str) and isinstance(m.get("role"), str)
                    for m in reply.messages):
                raise EpisodeFault("env_bad_reply", f"step returned {type(reply).__name__}, not an EnvReply of "
                                                    "{'role': str, 'content': str} messages")
            if reply.done or not reply.messages:
                break
            ids += bridge_tokens(ctx.tokenizer, messages, reply.messages, turn.token_ids, ctx.stop_token_ids)
            messages += reply.messages
        result = await self.env_call("score_episode", self.score_episode, state, messages)
        if not isinstance(result, EpisodeResult):
            raise EpisodeFault("env_bad_reply", f"score_episode returned {type(result).__name__}, not an EpisodeResult")
        if not result.messages:
            result.messages = messages
        return result
