"""`guess_digit`: a multi-turn game written in verifiers' v1 API (verifiers 0.4), fully offline.

The model guesses a secret digit; the environment, playing the user, answers "higher" or "lower"
until the guess is right or the turns run out. The reward is verifiers' own: `GuessDigitEnv.run`
records it on the trace with `trace.record_reward`, and `GuessDigitTask.@vf.reward` adds a term.

It is a module verifiers loads by id (`--env.taskset.id guess_digit`, or this project's
`task=verifiers task.env=guess_digit`), exporting its `Taskset`, its `Env` and its `Harness` via
`__all__`, as verifiers' loaders require (verifiers/v1/utils/loaders.py). Put this folder on
`PYTHONPATH` (or install the module) so `import guess_digit` works. `split: test` draws the
held-out digits from another seed (this project's `task.test_env_args={split: test}`).

`ChatHarness` runs the model's side in-process: each segment is one chat-completions call to the
rollout's interception endpoint (the contract `Harness.launch` states: every model call goes
through `endpoint` + `secret`), so nothing is installed or downloaded, unlike the built-in
harnesses, which prepare a `uv` script per runtime.
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterator
from typing import Literal

import verifiers.v1 as vf
from openai import AsyncOpenAI
from verifiers.v1.dialects.chat import message_to_wire

SYSTEM_PROMPT = "You play a guessing game. Answer with one digit only."


class GuessDigitConfig(vf.TasksetConfig):
    """The game's knobs (this project's `task.env_args`)."""

    num_tasks: int = 40
    """Secret digits in the taskset."""
    split: Literal["train", "test"] = "train"
    """Which digits: the held-out ones come from another seed."""
    max_turns: int = 3
    """Guesses the model gets."""
    seed: int = 0
    """Seeds the secret digits (the test split adds 1000)."""


class GuessDigitData(vf.TaskData):
    secret: int
    """The digit to find."""


class GuessDigitTask(vf.Task[GuessDigitData, vf.State, vf.TaskConfig]):
    @vf.reward(weight=0.0)
    async def guessed_first(self, task: GuessDigitData, trace: vf.Trace) -> float:
        """A zero-weight term (reported, not rewarded): the first guess was right. Task rewards run
        when the rollout closes, before `GuessDigitEnv.run` records its own; they read the trace."""
        messages = trace.branches[-1].messages if trace.branches else []
        replies = [m.content or "" for m in messages if m.role == "assistant"]
        return float(bool(replies) and parse_guess(replies[0]) == task.secret)


class GuessDigitEnvConfig(vf.EnvConfig):
    player: vf.AgentConfig = vf.AgentConfig(runtime=vf.SubprocessConfig())
    """The one seat; a local runtime, since the harness runs in-process."""


def parse_guess(text: str) -> int | None:
    """The first digit in a reply; None when it has none."""
    match = re.search(r"\d", text)
    return None if match is None else int(match.group())


class GuessDigitEnv(vf.Env[GuessDigitEnvConfig]):
    async def run(self, task, agents):
        secret, guesses = task.data.secret, []
        async with agents.player.interaction(task) as interaction:
            segment = await interaction.turn()
            for turn in range(self.taskset.config.max_turns):
                if segment.terminated:
                    break
                guess = parse_guess(segment.last_reply)
                guesses.append(guess)
                if guess == secret or turn == self.taskset.config.max_turns - 1:
                    break
                hint = "no digit in your reply" if guess is None else ("higher" if secret > guess else "lower")
                segment = await interaction.turn(f"{hint}. Guess again.")
        trace = interaction.trace
        trace.info["guesses"] = guesses
        trace.record_reward("found", float(secret in guesses), 1.0)


class GuessDigitTaskset(vf.Taskset[GuessDigitTask, GuessDigitConfig]):
    def load(self) -> Iterator[GuessDigitTask]:
        rng = random.Random(self.config.seed + (1000 if self.config.split == "test" else 0))
        for i in range(self.config.num_tasks):
            yield GuessDigitTask(
                GuessDigitData(id=f"guess_digit-{self.config.split}-{i}", prompt="Guess my digit (0-9).",
                               system_prompt=SYSTEM_PROMPT, secret=rng.randrange(10)),
                self.config.task)


class ChatHarnessConfig(vf.HarnessConfig):
    pass


class ChatHarness(vf.Harness[ChatHarnessConfig]):
    """One chat-completions call per segment, in-process, over the rollout's interception."""

    APPENDS_SYSTEM_PROMPT = True
    SUPPORTS_RESUME = True
    EXECUTES_CODE = False
    NEEDS_CONTAINER = False

    async def launch(self, ctx, trace, runtime, endpoint, secret, mcp_urls, data, **_):
        system, prompt = self.resolve_prompt(data)
        messages = [] if system is None else [{"role": "system", "content": system}]
        if isinstance(prompt, str):
            messages.append({"role": "user", "content": prompt})
        else:
            messages += [message_to_wire(m) for m in prompt or []]
        async with AsyncOpenAI(base_url=endpoint, api_key=secret, max_retries=0) as client:
            await client.chat.completions.create(model=ctx.model, messages=messages)
        return vf.ProgramResult(exit_code=0, stdout="", stderr="")


__all__ = ["ChatHarness", "GuessDigitEnv", "GuessDigitTaskset"]
