"""`guess_number`: a multi-turn game — the model guesses, the environment says higher or lower.

The environment holds a secret whole number in [`lo`, `hi`], fixed by the example (its answer).
Each model turn is a guess: its last number (tasks/arithmetic.py `last_number`, as the other
tasks read answers). The environment answers as the other player (a "user" message): "The number
is higher than 50." or "... lower than 50.", until the guess is right (the episode ends there) or
`max_turns` turns have been played. A turn without a number, or with one outside [lo, hi], is an
invalid guess: the reply asks for a number in the range and the turn is spent. Halving the range
each turn finds any secret of [1, 100] in 7 guesses, so the default 8 turns leave room for one
mistake.

Reward: 1.0 when the secret is found, plus `turn_bonus` × (turns left unplayed) / max_turns, so
with `turn_bonus` > 0 finding it sooner scores more (0.0 by default: found or not). Rubric terms:
`found`, `guesses` (valid guesses) and `invalid` (turns without a valid guess).

SmolLM2-135M-Instruct does not play it (greedy, 4 held-out secrets, 8 turns of 16 tokens): it
answers "I'm ready to help. What number would you like to guess?", taking the user's part, and
then repeats the reply's 100 ("The number 100 is a special number ...", a valid guess of 100):
found 0/4 with the default `prompt`, which at least draws numbers (28 guesses, 4 invalid turns);
with the question opening "I am thinking of a whole number" no turn held a number (32 invalid).
The game is here for models that can search, and for the episode machinery's tests.

Data: every secret in [lo, hi] is one example, shuffled once by `data_seed`; the first
`num_test_prompts` are the held-out split, the rest the training split. Every prompt reads the
same (the secret is not in it), so the held-out split measures the search on secrets training
never rewarded. An example's `meta` (samples.jsonl's `entry`) is its split, the secret and the range.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from jaxrl_async.envs.episode import EpisodeResult
from jaxrl_async.envs.task import ChatEnvTask, EnvReply, EnvTaskConfig
from jaxrl_async.tasks.arithmetic import last_number
from jaxrl_async.tasks.base import Example, HeldOutSplit, Prompt, register_task
from planner.configs import check


@dataclass(frozen=True, kw_only=True)
class GuessNumberConfig(EnvTaskConfig):
    """`task=guess_number`: find a secret number from higher/lower answers.

    Attributes:
      lo: smallest secret
      hi: largest secret (every number in [lo, hi] is one example)
      num_test_prompts: secrets held out for evaluation; the rest are the training split
      data_seed: shuffles the secrets (which are held out); the run's seed orders training
      turn_bonus: added to a found episode's 1.0, times the share of max_turns left unplayed
      prompt: the user message that opens the game, with {lo} and {hi} for the range
    """

    max_turns: int = 8
    lo: int = 1
    hi: int = 100
    num_test_prompts: int = 20
    data_seed: int = 0
    turn_bonus: float = 0.0
    prompt: str = ("Guess my secret number from {lo} to {hi}. Reply with one number only. After each guess "
                   "I tell you whether my number is higher or lower.")

    def __post_init__(self) -> None:
        super().__post_init__()
        check(isinstance(self.hi, int) and isinstance(self.lo, int) and self.hi > self.lo, "task.hi", self.hi,
              f"must be an int > lo={self.lo}")
        secrets = self.hi - self.lo + 1
        check(isinstance(self.num_test_prompts, int) and 0 <= self.num_test_prompts < secrets,
              "task.num_test_prompts", self.num_test_prompts,
              f"must be >= 0 and leave training secrets: there are {secrets} in [{self.lo}, {self.hi}]")
        check(self.turn_bonus >= 0, "task.turn_bonus", self.turn_bonus, "must be >= 0")
        try:
            self.prompt.format(lo=self.lo, hi=self.hi)
        except (KeyError, IndexError, ValueError) as e:
            check(False, "task.prompt", self.prompt, f"must be a text whose only fields are {{lo}} and {{hi}} ({e!r})")


@register_task
class GuessNumberTask(HeldOutSplit, ChatEnvTask):
    name = "guess_number"
    config_class = GuessNumberConfig
    items_name = "secrets"
    cfg: GuessNumberConfig

    def items(self) -> list[int]:
        cfg = self.cfg
        return [cfg.lo + int(i) for i in np.random.default_rng(cfg.data_seed).permutation(cfg.hi - cfg.lo + 1)]

    def make_examples(self, secrets: list[int], split: str) -> list[Example]:
        cfg = self.cfg
        content = cfg.prompt.format(lo=cfg.lo, hi=cfg.hi)
        return [Example(f"guess_number-{s}", content, s, {"split": split, "secret": s, "lo": cfg.lo, "hi": cfg.hi})
                for s in secrets]

    def guess(self, text: str) -> int | None:
        """The turn's guess: its last number when it lies in [lo, hi]; None (invalid) otherwise."""
        number = last_number(text)
        return number if number is not None and self.cfg.lo <= number <= self.cfg.hi else None

    def reset(self, prompt: Prompt) -> int:
        return int(prompt.answer)

    def step(self, state: int, messages: list[dict[str, Any]]) -> EnvReply:
        guess = self.guess(messages[-1]["content"])
        if guess == state:
            return EnvReply([{"role": "user", "content": "Correct!"}], done=True)
        if guess is None:
            text = f"Answer with one number from {self.cfg.lo} to {self.cfg.hi}."
        else:
            text = f"The number is {'higher' if state > guess else 'lower'} than {guess}."
        return EnvReply([{"role": "user", "content": text}])

    def score_episode(self, state: int, messages: list[dict[str, Any]]) -> EpisodeResult:
        guesses = [self.guess(m["content"]) for m in messages if m["role"] == "assistant"]
        found = state in guesses
        valid = [g for g in guesses if g is not None]
        left = self.cfg.max_turns - len(guesses)
        reward = (1.0 + self.cfg.turn_bonus * left / self.cfg.max_turns) if found else 0.0
        return EpisodeResult(reward=reward, terms={"found": float(found), "guesses": float(len(valid)),
                                                   "invalid": float(len(guesses) - len(valid))},
                             extracted_answer=None if not valid else str(valid[-1]))
