"""`calculator`: multi-digit products that need a tool; the model calls it and reads the result.

A 135M model cannot multiply 3-digit numbers in its head (SmolLM2-135M-Instruct gets 0 of the
held-out products right without the tool), but it can copy a number: an episode where it writes
`<calc>123*456</calc>`, reads the environment's "123*456 = 56088" and answers 56088 scores 1.0.
The skill the recipe (`+experiment=smollm2_calculator`) trains is calling the tool. Measured
greedy on 8 held-out prompts (3 turns of 32-40 tokens): with the question first and the tool's
description after it (four wordings), the model wrote no call (0/8; it writes "314 * 935 =" and a
wrong product); with the description first (the default `prompt`), 1/8 episodes held a
(malformed) call. Reward 0/8 in every case.

The episode (envs/task.py `ChatEnvTask`): each model turn that writes one or more calls gets one
reply (role `tool_role`) with a line per call, the result or an error; a turn without a call is
the final answer and ends the episode, as does the `max_turns`-th turn. A malformed call (an
unclosed `<calc>`, or an expression that is not whole numbers joined by + - *) is the model's
mistake, not the environment's: its line says what is wrong and the episode goes on.

Safe evaluation: the expression is parsed, never `eval`ed — whole numbers (a leading minus
allowed) joined by `+`, `-` and `*` (`x` and `×` read as `*`), `*` binding tighter, at most
`MAX_OPERANDS` numbers of at most `MAX_DIGITS` digits, so a result is never huge. No parentheses,
no division: the task needs neither.

Reward: 1.0 when the last number of the last assistant turn, with its tool calls cut out (so a
call is never read as the answer), equals the product; else 0.0. Rubric terms: `correct`,
`tool_calls` (the calls the model wrote, all turns) and `tool_errors` (those that were malformed).

Data: `num_prompts` distinct pairs (a, b), a of `a_digits` digits and b of `b_digits`, drawn once
by `data_seed`, each asked in the words of `prompt`; the first `num_test_prompts` are the
held-out split (`python -m jaxrl_async.eval`), the rest the training split. An example's `meta` (samples.jsonl's `entry`) is its split, a, b and
the product.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from jaxrl_async.envs.episode import EpisodeResult
from jaxrl_async.envs.task import ChatEnvTask, EnvReply, EnvTaskConfig
from jaxrl_async.tasks.arithmetic import last_number
from jaxrl_async.tasks.base import Example, HeldOutSplit, Prompt, register_task
from planner.configs import check

OPEN, CLOSE = "<calc>", "</calc>"
_CALL = re.compile(re.escape(OPEN) + r"(.*?)" + re.escape(CLOSE), re.DOTALL)
_NUMBER = re.compile(r"\s*(-?)\s*(\d+)")
_OPERATOR = re.compile(r"\s*([-+*x×])")
MAX_DIGITS = 12  # per number: products of such numbers stay readable
MAX_OPERANDS = 8


@dataclass(frozen=True, kw_only=True)
class CalculatorConfig(EnvTaskConfig):
    """`task=calculator`: a × b with a calculator tool, a fixed share of the pairs held out.

    Attributes:
      a_digits: digits of the first factor (e.g. 3: 100..999)
      b_digits: digits of the second factor
      num_prompts: distinct pairs drawn (training and held-out together)
      num_test_prompts: pairs held out for evaluation; the rest are the training split
      data_seed: draws the pairs (and so which are held out); the run's seed orders training
      prompt: the user message, with {a} and {b} for the factors: how to call the tool (with an
        example), then the question
      tool_role: the role of the tool's reply message ("user" reads as a turn of the conversation
        to a model tuned on user/assistant chats; "tool" where the chat template knows that role)
    """

    max_turns: int = 3
    a_digits: int = 3
    b_digits: int = 3
    num_prompts: int = 2000
    num_test_prompts: int = 32
    data_seed: int = 0
    prompt: str = ("You have a calculator. To use it, write the expression between <calc> and </calc>, "
                   "for example <calc>12*34</calc>, and I reply with the result.\nWhat is {a} * {b}?")
    tool_role: str = "user"

    def __post_init__(self) -> None:
        super().__post_init__()
        for key in ("a_digits", "b_digits"):
            value = getattr(self, key)
            check(isinstance(value, int) and 1 <= value <= 6, f"task.{key}", value, "must be an int in [1, 6]")
        pairs = _count(self.a_digits) * _count(self.b_digits)
        check(isinstance(self.num_prompts, int) and 2 <= self.num_prompts <= pairs, "task.num_prompts",
              self.num_prompts, f"must be an int in [2, {pairs}] (the pairs of {self.a_digits}- by "
                                f"{self.b_digits}-digit numbers)")
        check(isinstance(self.num_test_prompts, int) and 0 <= self.num_test_prompts < self.num_prompts,
              "task.num_test_prompts", self.num_test_prompts,
              f"must be >= 0 and leave training pairs: num_prompts={self.num_prompts}")
        check(bool(self.tool_role), "task.tool_role", self.tool_role, "must be a non-empty role name")
        try:
            self.prompt.format(a=1, b=2)
        except (KeyError, IndexError, ValueError) as e:
            check(False, "task.prompt", self.prompt, f"must be a text whose only fields are {{a}} and {{b}} ({e!r})")
        check("{a}" in self.prompt and "{b}" in self.prompt, "task.prompt", self.prompt, "must name both {a} and {b}")


def _count(digits: int) -> int:
    return 9 * 10 ** (digits - 1)


@dataclass(frozen=True)
class Call:
    """One tool call as the model wrote it: the expression, and its value or what is wrong with it."""

    expression: str
    value: int | None = None
    error: str | None = None

    def reply_line(self) -> str:
        shown = self.expression.strip()
        return f"{shown} = {self.value}" if self.error is None else f"error: {self.error}"


def evaluate(expression: str) -> int:
    """Whole numbers joined by + - * (x, × are *), * first; a ValueError says what is wrong."""
    if not expression.strip():
        raise ValueError("empty expression")
    text, pos, terms, numbers = expression, 0, [[]], 0  # terms: the products to add up
    while True:
        number = _NUMBER.match(text, pos)
        if number is None:
            rest = text[pos:].strip()
            raise ValueError(f"expected a number at {rest[:12]!r}" if rest else "expected a number at the end")
        if len(number.group(2)) > MAX_DIGITS:
            raise ValueError(f"a number has more than {MAX_DIGITS} digits")
        terms[-1].append(int(number.group(1) + number.group(2)))
        numbers += 1
        if numbers > MAX_OPERANDS:
            raise ValueError(f"more than {MAX_OPERANDS} numbers")
        pos = number.end()
        if not text[pos:].strip():
            break
        operator = _OPERATOR.match(text, pos)
        if operator is None:
            raise ValueError(f"unexpected {text[pos:].strip()[:12]!r}: only whole numbers and + - * are allowed")
        pos = operator.end()
        if operator.group(1) == "+":
            terms.append([])
        elif operator.group(1) == "-":
            terms.append([-1])  # a - b is a + (-1 * b)
    total = 0
    for factors in terms:
        product = 1
        for f in factors:
            product *= f
        total += product
    return total


def tool_calls(text: str) -> list[Call]:
    """Every call in a turn, in order; an unclosed `<calc>` at the end is a malformed call."""
    calls = []
    for match in _CALL.finditer(text):
        try:
            calls.append(Call(match.group(1), value=evaluate(match.group(1))))
        except ValueError as e:
            calls.append(Call(match.group(1), error=f"{match.group(1).strip()!r}: {e}"))
    tail = _CALL.sub("", text)
    if OPEN in tail:
        calls.append(Call(tail.split(OPEN, 1)[1], error=f"{OPEN} is not closed by {CLOSE}"))
    return calls


def final_answer(text: str) -> int | None:
    """The last number of a turn outside its tool calls (an unclosed call's text included)."""
    return last_number(_CALL.sub("", text).split(OPEN, 1)[0])


@register_task
class CalculatorTask(HeldOutSplit, ChatEnvTask):
    name = "calculator"
    config_class = CalculatorConfig
    items_name = "pairs"
    cfg: CalculatorConfig

    def items(self) -> list[tuple[int, int]]:
        cfg = self.cfg
        nb = _count(cfg.b_digits)
        drawn = np.random.default_rng(cfg.data_seed).choice(_count(cfg.a_digits) * nb, cfg.num_prompts, replace=False)
        return [(10 ** (cfg.a_digits - 1) + int(i) // nb, 10 ** (cfg.b_digits - 1) + int(i) % nb) for i in drawn]

    def make_examples(self, pairs: list[tuple[int, int]], split: str) -> list[Example]:
        return [Example(f"calculator-{a}*{b}", self.cfg.prompt.format(a=a, b=b), a * b,
                        {"split": split, "a": a, "b": b, "product": a * b}) for a, b in pairs]

    def reset(self, prompt: Prompt) -> int:
        return int(prompt.answer)

    def step(self, state: int, messages: list[dict[str, Any]]) -> EnvReply:
        calls = tool_calls(messages[-1]["content"])
        if not calls:
            return EnvReply([], done=True)
        return EnvReply([{"role": self.cfg.tool_role, "content": "\n".join(c.reply_line() for c in calls)}])

    def score_episode(self, state: int, messages: list[dict[str, Any]]) -> EpisodeResult:
        turns = [m["content"] for m in messages if m["role"] == "assistant"]
        calls = [c for text in turns for c in tool_calls(text)]
        answer = final_answer(turns[-1]) if turns else None
        correct = float(answer == state)
        return EpisodeResult(reward=correct, terms={"correct": correct, "tool_calls": float(len(calls)),
                                                    "tool_errors": float(sum(c.error is not None for c in calls))},
                             extracted_answer=None if answer is None else str(answer))
