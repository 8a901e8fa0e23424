"""`calculator`: multi-digit products that need a tool; the model calls it and reads the result.

A 135M model cannot multiply 3-digit numbers in its head, but it can copy a number: an episode
where it writes a call for 123*456, reads the environment's reply 56088 and answers 56088 scores
1.0. The skill the recipe (`+experiment=smollm2_calculator`) trains is calling the tool and then
answering with what it returned.

Two ways to call it (`tool`, TOOLS), each taught by its default prompt with one example:
- "python" (default): a fenced ```python block of assignments, `print(...)` and expressions over
  whole numbers with + - *, e.g. `print(123*456)`; the reply is what it prints (else the value
  of its last expression). It is run by walking its syntax tree (`ast.parse`, never exec/eval):
  any other statement, name, call or operator is an error.
- "calc": `<calc>123*456</calc>`; the reply is "123*456 = 56088". The expression is parsed by
  hand: whole numbers (a leading minus allowed) joined by + - * (`x`, `×` read as *), * first.
Both bound the work: at most `MAX_OPERANDS` numbers of `MAX_DIGITS` digits per calc expression,
`MAX_CODE_CHARS` of code and results of at most MAX_DIGITS x MAX_OPERANDS digits per block.

Why python is the default, measured on SmolLM2-135M-Instruct, greedy, the first 8 held-out
prompts, 3 turns of at most 40 tokens: with `<calc>` (six wordings, question first or last) the
model wrote a call in at most 1 of 8 episodes, malformed, and scored 0/8 — it writes
"314 * 935 = " and a wrong product; with the python prompt it wrote a block in 8 of 8, the right
product in 5 of 8 first turns, and scored 2/8: it keeps calling the tool after the result came
back (e.g. `math.factorial(293590)`), which is what training has to remove.

The episode (envs/task.py `ChatEnvTask`): each model turn that writes one or more calls gets one
reply (role `tool_role`) with a line per call, the output or an error; a turn without a call is
the final answer and ends the episode, as does the `max_turns`-th turn. A malformed call (one left
unclosed, often cut at the turn's token limit, or code the tool refuses) is the model's mistake,
not the environment's: its line says what is wrong and the episode goes on.

Reward: 1.0 when the last number of the last assistant turn, with its tool calls cut out (so a
call is never read as the answer), equals the product; else 0.0. Rubric terms: `correct`,
`tool_calls` (the calls the model wrote, all turns) and `tool_errors` (those that were malformed).

Data: `num_prompts` distinct pairs (a, b), a of `a_digits` digits and b of `b_digits`, drawn once
by `data_seed`, each asked in the words of `prompt`; the first `num_test_prompts` are the
held-out split (`python -m jaxrl_async.eval`), the rest the training split. An example's `meta`
(samples.jsonl's `entry`) is its split, a, b and the product.
"""

from __future__ import annotations

import ast
import math
import operator
import re
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from jaxrl_async.envs.episode import EpisodeResult
from jaxrl_async.envs.task import ChatEnvTask, EnvReply, EnvTaskConfig
from jaxrl_async.tasks.arithmetic import last_number
from jaxrl_async.tasks.base import Example, HeldOutSplit, Prompt, register_task
from planner.configs import check

_NUMBER = re.compile(r"\s*(-?)\s*(\d+)")
_OPERATOR = re.compile(r"\s*([-+*x×])")
MAX_DIGITS = 12  # per number: products of such numbers stay readable
MAX_OPERANDS = 8
MAX_CODE_CHARS = 1000  # a Python call's code: bounds the parse
QUOTE_CHARS = 40  # of the code an error line quotes


@dataclass(frozen=True, kw_only=True)
class CalculatorConfig(EnvTaskConfig):
    """`task=calculator`: a × b with a calculator tool, a fixed share of the pairs held out.

    Attributes:
      a_digits: digits of the first factor (e.g. 3: 100..999)
      b_digits: digits of the second factor
      num_prompts: distinct pairs drawn (training and held-out together)
      num_test_prompts: pairs held out for evaluation; the rest are the training split
      data_seed: draws the pairs (and so which are held out); the run's seed orders training
      tool: how the model calls the tool (TOOLS): "python" (a ```python block of assignments,
        print and + - * over whole numbers, never executed) or "calc" (<calc>12*34</calc>)
      prompt: the user message, with {a} and {b} for the factors: how to call the tool (with an
        example), then the question; null = the tool's own (TOOLS[tool].prompt)
      tool_role: the role of the tool's reply message ("user" reads as a turn of the conversation
        to a model tuned on user/assistant chats; "tool" where the chat template knows that role)
    """

    max_turns: int = 3
    a_digits: int = 3
    b_digits: int = 3
    num_prompts: int = 2000
    num_test_prompts: int = 32
    data_seed: int = 0
    tool: str = "python"
    prompt: str | None = None
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
        check(self.tool in TOOLS, "task.tool", self.tool, f"must be one of {sorted(TOOLS)}")
        if self.prompt is None:
            return
        try:
            self.prompt.format(a=1, b=2)
        except (KeyError, IndexError, ValueError) as e:
            check(False, "task.prompt", self.prompt, f"must be a text whose only fields are {{a}} and {{b}} ({e!r})")
        check("{a}" in self.prompt and "{b}" in self.prompt, "task.prompt", self.prompt, "must name both {a} and {b}")


def _count(digits: int) -> int:
    return 9 * 10 ** (digits - 1)


@dataclass(frozen=True)
class Call:
    """One tool call as the model wrote it: its code, and the tool's output or what is wrong with it."""

    code: str
    output: str | None = None
    error: str | None = None

    def reply_line(self) -> str:
        return self.output if self.error is None else f"error: {self.error}"


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
        op = _OPERATOR.match(text, pos)
        if op is None:
            raise ValueError(f"unexpected {text[pos:].strip()[:12]!r}: only whole numbers and + - * are allowed")
        pos = op.end()
        if op.group(1) == "+":
            terms.append([])
        elif op.group(1) == "-":
            terms.append([-1])  # a - b is a + (-1 * b)
    return sum(math.prod(factors) for factors in terms)


@dataclass(frozen=True)
class ToolSyntax:
    """How the model writes a call: the marks around its code (regular expressions), what runs the
    code (its output, or a ValueError), and the default prompt that teaches it with one example."""

    open: str
    close: str
    run: Callable[[str], str]
    prompt: str

    def calls(self, text: str) -> list[Call]:
        """Every call in a turn, in order; an opening mark left unclosed at the end is a malformed call."""
        calls = []
        for match in re.finditer(f"{self.open}(.*?){self.close}", text, re.DOTALL):
            try:
                calls.append(Call(match.group(1), output=self.run(match.group(1))))
            except ValueError as e:
                calls.append(Call(match.group(1), error=str(e)))
        unclosed = re.search(f"{self.open}(.*)", self.outside(text), re.DOTALL)
        if unclosed:
            calls.append(Call(unclosed.group(1), error="the call is not closed"))
        return calls

    def outside(self, text: str) -> str:
        """The turn with its closed calls cut out."""
        return re.sub(f"{self.open}(.*?){self.close}", "", text, flags=re.DOTALL)

    def final_answer(self, text: str) -> int | None:
        """The last number of a turn outside its tool calls (an unclosed call's text included)."""
        return last_number(re.split(self.open, self.outside(text), maxsplit=1)[0])


def run_python(code: str) -> str:
    """A Python block of assignments, `print(...)` and expressions over whole numbers, + - * and
    the names it assigned, run by walking its syntax tree (never exec/eval): what it prints, else
    the value of its last bare expression (as a REPL shows it)."""
    if len(code) > MAX_CODE_CHARS:
        raise ValueError(f"more than {MAX_CODE_CHARS} characters")
    try:
        tree = ast.parse(textwrap.dedent(code).strip())
    except SyntaxError as e:
        raise ValueError(f"syntax error: {e.msg}") from None
    names: dict[str, int] = {}
    printed: list[int] = []
    last = None
    for stmt in tree.body:
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
            names[stmt.targets[0].id] = _value(stmt.value, names)
        elif (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call) and isinstance(stmt.value.func, ast.Name)
              and stmt.value.func.id == "print" and not stmt.value.keywords):
            printed.append(" ".join(str(_value(arg, names)) for arg in stmt.value.args))
        elif isinstance(stmt, ast.Expr):
            last = _value(stmt.value, names)
        else:
            raise ValueError(f"{_quote(ast.unparse(stmt))}: only assignments, print(...) and expressions are allowed")
    if printed:
        return "\n".join(printed)
    return "(no output)" if last is None else str(last)


def _value(node: ast.expr, names: dict[str, int]) -> int:
    """A whole number from constants, assigned names, + - * and a sign; a ValueError otherwise."""
    if isinstance(node, ast.Constant) and type(node.value) is int:
        if len(str(abs(node.value))) > MAX_DIGITS:
            raise ValueError(f"a number has more than {MAX_DIGITS} digits")
        return node.value
    if isinstance(node, ast.Name) and node.id in names:
        return names[node.id]
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        value = _value(node.operand, names)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        value = _BINARY[type(node.op)](_value(node.left, names), _value(node.right, names))
        if len(str(abs(value))) > MAX_DIGITS * MAX_OPERANDS:
            raise ValueError("the result is too large")
        return value
    raise ValueError(f"{_quote(ast.unparse(node))} is not whole numbers and + - *")


def run_calc(expression: str) -> str:
    """`evaluate` as the calculator's reply: "12*34 = 408"; its error names the expression."""
    try:
        return f"{expression.strip()} = {evaluate(expression)}"
    except ValueError as e:
        raise ValueError(f"{_quote(expression.strip())}: {e}") from None


def _quote(code: str) -> str:
    """Code as an error line quotes it: at most QUOTE_CHARS, so a reply stays short."""
    return repr(code if len(code) <= QUOTE_CHARS else code[:QUOTE_CHARS] + "...")


_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul}
TOOLS = {
    "calc": ToolSyntax(
        re.escape("<calc>"), re.escape("</calc>"), run_calc,
        "You have a calculator. To use it, write the expression between <calc> and </calc>, for example "
        "<calc>12*34</calc>, and I reply with the result.\nWhat is {a} * {b}?"),
    "python": ToolSyntax(
        r"```(?:python|py)?", "```", run_python,
        "You can run Python: write a code block, for example\n```python\nprint(12*34)\n```\nand I reply "
        "with what it prints.\nWhat is {a} * {b}?"),
}


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
        return [Example(f"calculator-{a}*{b}", self.question.format(a=a, b=b), a * b,
                        {"split": split, "a": a, "b": b, "product": a * b}) for a, b in pairs]

    @property
    def syntax(self) -> ToolSyntax:
        return TOOLS[self.cfg.tool]

    @property
    def question(self) -> str:
        return self.syntax.prompt if self.cfg.prompt is None else self.cfg.prompt

    def reset(self, prompt: Prompt) -> int:
        return int(prompt.answer)

    def step(self, state: int, messages: list[dict[str, Any]]) -> EnvReply:
        calls = self.syntax.calls(messages[-1]["content"])
        if not calls:
            return EnvReply([], done=True)
        return EnvReply([{"role": self.cfg.tool_role, "content": "\n".join(c.reply_line() for c in calls)}])

    def score_episode(self, state: int, messages: list[dict[str, Any]]) -> EpisodeResult:
        turns = [m["content"] for m in messages if m["role"] == "assistant"]
        calls = [c for text in turns for c in self.syntax.calls(text)]
        answer = self.syntax.final_answer(turns[-1]) if turns else None
        correct = float(answer == state)
        return EpisodeResult(reward=correct, terms={"correct": correct, "tool_calls": float(len(calls)),
                                                    "tool_errors": float(sum(c.error is not None for c in calls))},
                             extracted_answer=None if answer is None else str(answer))
