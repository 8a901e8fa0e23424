"""`arithmetic`: short integer problems ("What is 7 * 8?"), rewarded by the last number of the answer.

A real pretrained model (SmolLM2-135M-Instruct) starts weak but not hopeless on them and a CPU
can generate their short answers quickly, so the trainer's effect on a real model is measurable
in minutes (README "Train a real model"). Measured with the JAX engine on 48 prompts: one-digit
a+b 37/48 right greedy, 12/48 sampled at T=1; two-digit a+b 8/48 and 0/48; one-digit a*b 22/48
and 9/48.

Data: every ordered pair (a, b) with `min_operand <= a, b <= max_operand`, shuffled once by
`data_seed`; the first `num_test_prompts` pairs are the held-out split, the rest the training
split, so no training prompt is ever scored by `python -m jaxrl_async.eval`. Prompt: "What is
a OP b?" plus `instruction`. Reward: 1.0 when the last number in the completion (commas
removed) equals the exact result, else 0.0 — the model may reason first, only its final
number counts.
"""

from __future__ import annotations

import itertools
import operator
import re
from dataclasses import dataclass

import numpy as np

from jaxrl_async.tasks.base import Example, HeldOutSplit, Prompt, TaskConfig, register_task
from planner.configs import check

OPERATIONS = {"+": operator.add, "-": operator.sub, "*": operator.mul}
_NUMBER = re.compile(r"-?\d+")


@dataclass(frozen=True, kw_only=True)
class ArithmeticConfig(TaskConfig):
    """`task=arithmetic`: every operand pair of one operation, a fixed share held out.

    Attributes:
      operation: + | - | * (OPERATIONS)
      min_operand: smallest operand
      max_operand: largest operand (every ordered pair in the range is a prompt)
      num_test_prompts: pairs held out for evaluation; the rest are the training split
      data_seed: shuffles the pairs (which are held out); the run's seed orders training
      instruction: appended to each question (after a space)
    """

    operation: str = "*"
    min_operand: int = 1
    max_operand: int = 9
    num_test_prompts: int = 24
    data_seed: int = 0
    instruction: str = "Answer with the number only."

    def __post_init__(self) -> None:
        super().__post_init__()
        check(self.operation in OPERATIONS, "task.operation", self.operation, f"must be one of {sorted(OPERATIONS)}")
        check(self.max_operand >= self.min_operand, "task.max_operand", self.max_operand,
              f"must be >= min_operand={self.min_operand}")
        pairs = (self.max_operand - self.min_operand + 1) ** 2
        check(0 <= self.num_test_prompts < pairs, "task.num_test_prompts", self.num_test_prompts,
              f"must be >= 0 and leave training pairs: there are {pairs} pairs")


def last_number(text: str) -> int | None:
    """The last integer written in `text` (thousands separators removed), or None."""
    found = _NUMBER.findall(text.replace(",", ""))
    return int(found[-1]) if found else None


@register_task
class ArithmeticTask(HeldOutSplit):
    name = "arithmetic"
    config_class = ArithmeticConfig
    items_name = "pairs"
    cfg: ArithmeticConfig

    def items(self) -> list[tuple[int, int]]:
        cfg = self.cfg
        pairs = list(itertools.product(range(cfg.min_operand, cfg.max_operand + 1), repeat=2))
        order = np.random.default_rng(cfg.data_seed).permutation(len(pairs))
        return [pairs[i] for i in order]

    def make_examples(self, pairs: list[tuple[int, int]], split: str) -> list[Example]:
        op, fn = self.cfg.operation, OPERATIONS[self.cfg.operation]
        return [Example(f"arithmetic-{a}{op}{b}", f"What is {a} {op} {b}? {self.cfg.instruction}", fn(a, b),
                        {"split": split}) for a, b in pairs]

    async def score(self, prompt: Prompt, completion_text: str, completion_ids: list[int]) -> float:
        return float(last_number(completion_text) == prompt.answer)
