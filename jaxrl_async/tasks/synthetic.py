"""Synthetic tasks that a tiny random model learns with GRPO on a CPU in minutes.

Both tasks show a letter string in the prompt and reward, per character, how well the completion
reproduces it. The reward is dense on purpose: every right character counts, so a group of
samples almost always has some spread for GRPO's group-relative advantage to work on.

Why a random `tiny` model starts low: its byte vocabulary has 264 tokens and its random init gives
a near-uniform next-token distribution, so a sampled character is the one wanted with probability
about 1/264 and the expected reward is well under 0.01 (test_tasks measures it). Invalid UTF-8
bytes decode to U+FFFD, which never matches.

What it has to learn:
- `repeat_letter` (default, easy): "repeat c" -> a completion made of c. Reward: the fraction of
  the completion's characters equal to c. First it learns to emit the alphabet's letters at all
  (reward ~1/len(alphabet)), then to read the one letter out of the prompt: one attention head
  that finds the letter and a map from its embedding to its own logit.
- `copy_string` (harder): "copy s" (s: `min_len`..`max_len` letters) -> s. Reward: the fraction
  of positions i < len(s) with completion[i] == s[i]; what follows is ignored (the engine's
  `max_new_tokens` bounds it). It needs position-aware copying, one character per step.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from jaxrl_async.tasks.base import Example, Prompt, Task, TaskConfig, register_task


def _check_alphabet(alphabet: str) -> None:
    if not alphabet or len(set(alphabet)) != len(alphabet) or any(c.isspace() for c in alphabet):
        raise ValueError(f"task.alphabet={alphabet!r}: must be non-empty, without repeats or whitespace")


def _check_positive(key: str, value: int) -> None:
    if value < 1:
        raise ValueError(f"task.{key}={value!r}: must be >= 1")


@dataclass(frozen=True, kw_only=True)
class RepeatLetterConfig(TaskConfig):
    alphabet: str = "abcdefgh"  # the letters a prompt can ask for
    num_prompts: int = 64  # prompts per epoch; letters cycle through the alphabet

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_alphabet(self.alphabet)
        _check_positive("num_prompts", self.num_prompts)


@register_task
class RepeatLetterTask(Task):
    name = "repeat_letter"
    config_class = RepeatLetterConfig
    cfg: RepeatLetterConfig

    def examples(self) -> list[Example]:
        letters = self.cfg.alphabet
        return [Example(f"repeat_letter-{i}", letters[i % len(letters)] * 8,
                        letters[i % len(letters)]) for i in range(self.cfg.num_prompts)]

    async def score(self, prompt: Prompt, completion_text: str, completion_ids: list[int]) -> float:
        if not completion_text:
            return 0.0
        return completion_text.count(prompt.answer) / len(completion_text)


@dataclass(frozen=True, kw_only=True)
class CopyStringConfig(TaskConfig):
    alphabet: str = "abcdefgh"  # the letters strings are drawn from
    min_len: int = 2  # shortest string to copy
    max_len: int = 3  # longest string to copy
    num_prompts: int = 256  # prompts per epoch
    data_seed: int = 0  # seeds the strings (the stream's seed only orders them)

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_alphabet(self.alphabet)
        _check_positive("min_len", self.min_len)
        _check_positive("num_prompts", self.num_prompts)
        if self.max_len < self.min_len:
            raise ValueError(f"task.max_len={self.max_len!r}: must be >= min_len={self.min_len!r}")


@register_task
class CopyStringTask(Task):
    name = "copy_string"
    config_class = CopyStringConfig
    cfg: CopyStringConfig

    def examples(self) -> list[Example]:
        cfg = self.cfg
        rng = np.random.default_rng(cfg.data_seed)
        lengths = rng.integers(cfg.min_len, cfg.max_len + 1, size=cfg.num_prompts)
        strings = ["".join(rng.choice(list(cfg.alphabet), size=n)) for n in lengths]
        return [Example(f"copy_string-{i}", " ".join([s] * 4), s) for i, s in enumerate(strings)]

    async def score(self, prompt: Prompt, completion_text: str, completion_ids: list[int]) -> float:
        target: str = prompt.answer
        return sum(a == b for a, b in zip(completion_text, target)) / len(target)
