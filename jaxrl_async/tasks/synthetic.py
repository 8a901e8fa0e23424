"""Synthetic tasks that a tiny random model learns with GRPO on a CPU in minutes.

Both tasks show a letter string in the prompt and reward, per character, how well the completion
reproduces it. The reward is dense on purpose: every right character counts, so a group of
samples almost always has some spread for GRPO's group-relative advantage to work on.

Why a random `tiny` model starts low: its byte vocabulary has 264 tokens and its random init gives
a near-uniform next-token distribution, so a sampled character is the one wanted with probability
about 1/264 and the expected reward is well under 0.01 (tests/jaxrl_async/tasks/test_synthetic.py
measures it). Invalid UTF-8 bytes decode to U+FFFD, which never matches.

What it has to learn:
- `repeat_letter` (default, easy): prompt "cccccccc" -> a completion made of c. Reward: the
  fraction of the completion's characters equal to c. First it learns to emit the alphabet's
  letters at all (reward ~1/len(alphabet)), then to copy the prompt's letter. The prompt is the
  letter 8 times, not "repeat c": as 8 of the 27 templated prompt tokens, the letter carries a
  large share of even the near-uniform attention of a random model, so copying it is close to
  one linear map away. With "repeat c" the same GRPO loop stalled at 1/len(alphabet) for 200
  steps; with "cccccccc" it passed 0.8 at about step 90 and 0.97 at step 100 (on-policy GRPO,
  8 groups x 8 samples, 8 new tokens, temperature 1, Adam 3e-3, the 2-layer `tiny`).
- `copy_string` (harder): prompt "abc abc abc abc" (s, `min_len`..`max_len` letters, 4 times)
  -> s. Reward: the fraction of positions i < len(s) with completion[i] == s[i]; what follows is
  ignored (the engine's `max_new_tokens` bounds it). It needs order, not just the letters: the
  same loop reached 0.3 by step 200 and 0.3-0.45 over steps 200-300.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from jaxrl_async.tasks.base import Example, Prompt, Task, TaskConfig, register_task
from planner.configs import check


def _check_alphabet(alphabet: str) -> None:
    ok = alphabet and len(set(alphabet)) == len(alphabet) and not any(c.isspace() for c in alphabet)
    check(bool(ok), "task.alphabet", alphabet, "must be non-empty, without repeats or whitespace")


@dataclass(frozen=True, kw_only=True)
class RepeatLetterConfig(TaskConfig):
    """`task=repeat_letter`: one letter repeated; the reward is the share of matching characters.

    Attributes:
      alphabet: the letters a prompt can ask for
      num_prompts: prompts per epoch; letters cycle through the alphabet
    """

    alphabet: str = "abcdefgh"
    num_prompts: int = 64

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_alphabet(self.alphabet)
        check(self.num_prompts >= 1, "task.num_prompts", self.num_prompts, "must be >= 1")


@register_task
class RepeatLetterTask(Task):
    name = "repeat_letter"
    config_class = RepeatLetterConfig
    cfg: RepeatLetterConfig

    def examples(self) -> list[Example]:
        letters = self.cfg.alphabet
        return [Example(f"repeat_letter-{i}", letters[i % len(letters)] * 8,
                        letters[i % len(letters)]) for i in range(self.cfg.num_prompts)]

    def test_examples(self) -> list[Example]:
        """Each letter once: the task has only len(alphabet) distinct prompts, so its test split
        measures the skill on every one of them, not generalisation to unseen prompts."""
        return [Example(f"repeat_letter-test-{c}", c * 8, c) for c in self.cfg.alphabet]

    async def score(self, prompt: Prompt, completion_text: str, completion_ids: list[int]) -> float:
        if not completion_text:
            return 0.0
        return completion_text.count(prompt.answer) / len(completion_text)


@dataclass(frozen=True, kw_only=True)
class CopyStringConfig(TaskConfig):
    """`task=copy_string`: copy a short random string.

    Attributes:
      alphabet: the letters strings are drawn from
      min_len: shortest string to copy
      max_len: longest string to copy
      num_prompts: prompts per epoch
      num_test_prompts: held-out strings (split=test), none of them a training string
      data_seed: seeds the strings (the stream's seed only orders them)
    """

    alphabet: str = "abcdefgh"
    min_len: int = 2
    max_len: int = 3
    num_prompts: int = 256
    num_test_prompts: int = 64
    data_seed: int = 0

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_alphabet(self.alphabet)
        for name in ("min_len", "num_prompts", "num_test_prompts"):
            check(getattr(self, name) >= 1, f"task.{name}", getattr(self, name), "must be >= 1")
        check(self.max_len >= self.min_len, "task.max_len", self.max_len, f"must be >= min_len={self.min_len!r}")


@register_task
class CopyStringTask(Task):
    name = "copy_string"
    config_class = CopyStringConfig
    cfg: CopyStringConfig

    def examples(self) -> list[Example]:
        cfg = self.cfg
        return [Example(f"copy_string-{i}", " ".join([s] * 4), s)
                for i, s in enumerate(self._strings(cfg.data_seed, cfg.num_prompts))]

    def test_examples(self) -> list[Example]:
        """Up to `num_test_prompts` distinct strings that are not training strings (fewer when
        the alphabet and lengths allow fewer), drawn from a stream of their own."""
        cfg, seen = self.cfg, {e.answer for e in self.examples()}
        held_out: list[str] = []
        for s in self._strings([cfg.data_seed, 1], 50 * cfg.num_test_prompts):
            if s not in seen:
                seen.add(s)
                held_out.append(s)
                if len(held_out) == cfg.num_test_prompts:
                    break
        if not held_out:
            raise ValueError(f"task copy_string: every string of the alphabet {cfg.alphabet!r} with lengths "
                             f"{cfg.min_len}..{cfg.max_len} is a training string; no held-out split is left")
        return [Example(f"copy_string-test-{i}", " ".join([s] * 4), s) for i, s in enumerate(held_out)]

    def _strings(self, seed, count: int) -> list[str]:
        cfg = self.cfg
        rng = np.random.default_rng(seed)
        lengths = rng.integers(cfg.min_len, cfg.max_len + 1, size=count)
        return ["".join(rng.choice(list(cfg.alphabet), size=n)) for n in lengths]

    async def score(self, prompt: Prompt, completion_text: str, completion_ids: list[int]) -> float:
        target: str = prompt.answer
        return sum(a == b for a, b in zip(completion_text, target)) / len(target)
