"""The task contract: where prompts come from and how a completion is rewarded.

A task owns a list of `Example`s (the raw prompts with their answers) and a verifier. The runtime
asks it for a `PromptStream` (tokenized `Prompt`s, shuffled per epoch, checkpointable) and, for
every finished trajectory, for `reward(prompt, completion_text, completion_ids)`, which never
raises: errors become a 0.0 reward with the reason attached (see rewards.py).

Splits: `examples()` is the training split; `test_examples()` is the held-out split that
`python -m jaxrl_async.eval` scores by default — prompts training never sees (a file of its own,
or generated apart from the training ones). A task without one says so when asked.

To add a task: subclass `TaskConfig` (a frozen dataclass, every field with a default and an
entry in its docstring's `Attributes:` section) and `Task` (set `name` and `config_class`,
implement `examples` and `score`, and `test_examples` when it has a held-out split), decorate it
with `@register_task`, import its module in `tasks/__init__.py` and add `conf/task/<name>.yaml`.
Every task also takes `reward_fn` (a user function that replaces `score`), `reward_timeout_s`,
`reward_workers` and `max_reward_failure_rate`.
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from jaxrl_async.tasks.lengths import LENGTHS
from jaxrl_async.tasks.reward_pool import RewardPool
from jaxrl_async.tasks.rewards import RewardResult, RewardRunner
from jaxrl_async.tasks.stream import PromptStream
from jaxrl_async.tokenizer import Tokenizer
from planner.configs import build, check


SPLITS = ("train", "test")


@dataclass(frozen=True)
class Example:
    """One raw prompt of a task, before the chat template and the tokenizer."""

    prompt_id: str  # stable across runs: the ledger and length predictors key on it
    content: str  # the user message (the question), without any chat formatting
    answer: Any  # what `score` checks against (JSON-serialisable)
    meta: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Prompt:
    """A tokenized prompt, ready for the engine."""

    prompt_id: str
    text: str  # exactly what the model sees: the chat template applied to the content
    prompt_ids: list[int]  # `text` tokenized (no BOS added on top of a template)
    answer: Any
    meta: dict  # the example's meta plus "content": the raw user message


@dataclass(frozen=True, kw_only=True)
class TaskConfig:
    """Keys every task takes; a task's own config subclasses this. `build_task` builds it with
    `planner.configs.build`, which refuses an unknown key and a value of the wrong type.

    Attributes:
        reward_fn: dotted path `module:function` (or `module.function`) of a user reward
            `(prompt_text, completion_text, answer) -> float`, sync or async; replaces the task's
            own `score`. `prompt_text` is the raw user message (Prompt.meta["content"]).
        reward_timeout_s: a reward call that takes longer scores the fallback (0.0) with a
            `timeout` error; a user `reward_fn` runs in a worker process, which is killed at this
            deadline (tasks/reward_pool.py).
        reward_workers: reward worker processes (user `reward_fn`, gsm8k's math-verify): calls
            that run at once.
        max_reward_failure_rate: the run stops (one `error:` line, a checkpoint to resume from)
            when more than this share of the last batch's worth of rewards (batch_groups x
            group_size) failed: it never trains on a batch of fallback scores. 1.0: never stop;
            0.0: stop at the first batch with any failure.
        lengths: "model": samples end at the model's stop token or max_new_tokens. "heavy_tail":
            each prompt gets its own max_new_tokens from the simulator's heavy-tail distribution
            and stop tokens are ignored (tasks/lengths.py), so lengths are heavy-tailed on any
            model (tail benchmarks).
        length_scale: heavy_tail: the Pareto minimum length, as a share of max_new_tokens, in (0, 1].
        length_alpha: heavy_tail: the tail index; smaller is heavier.
    """

    reward_fn: str | None = None
    reward_timeout_s: float = 30.0
    reward_workers: int = 8
    max_reward_failure_rate: float = 0.5
    lengths: str = "model"
    length_scale: float = 0.1
    length_alpha: float = 1.5

    def __post_init__(self) -> None:
        check(self.reward_timeout_s > 0, "task.reward_timeout_s", self.reward_timeout_s, "must be > 0")
        check(self.reward_workers >= 1, "task.reward_workers", self.reward_workers, "must be an int >= 1")
        check(0.0 <= self.max_reward_failure_rate <= 1.0, "task.max_reward_failure_rate",
              self.max_reward_failure_rate, "must be in [0, 1] (a share of a batch's rewards)")
        check(self.lengths in LENGTHS, "task.lengths", self.lengths, f"must be one of {LENGTHS}")
        check(0.0 < self.length_scale <= 1.0, "task.length_scale", self.length_scale, "must be in (0, 1]")
        check(self.length_alpha > 0, "task.length_alpha", self.length_alpha, "must be > 0")


class Task(abc.ABC):
    """A prompt dataset plus its verifier. Subclasses set `name` and `config_class`."""

    name: ClassVar[str]
    config_class: ClassVar[type[TaskConfig]]
    # Dotted path of a module-level `(answer, completion_text) -> float` that replaces `score` and
    # runs in the reward worker processes: for a verifier that may hang (tasks/rewards.py).
    isolated_score: ClassVar[str | None] = None
    # True for a task whose samples are episodes (jaxrl_async/envs/task.py EpisodeTask).
    multi_turn: ClassVar[bool] = False

    def __init__(self, cfg: TaskConfig):
        if not isinstance(cfg, self.config_class):
            raise ValueError(f"task {self.name!r} needs a {self.config_class.__name__}, got {type(cfg).__name__}")
        self.cfg = cfg
        # Resolved here, at start-up: a bad dotted path must not surface at the first reward.
        # Where each reward runs is decided per reward (tasks/rewards.py): a user function or an
        # `isolated_score` in killable worker processes, a built-in `score` in-process.
        if cfg.reward_fn is not None:
            self._pool = RewardPool(cfg.reward_fn, cfg.reward_timeout_s, workers=cfg.reward_workers)
        elif self.isolated_score is not None:
            self._pool = RewardPool(self.isolated_score, cfg.reward_timeout_s, workers=cfg.reward_workers)
        else:
            self._pool = None
        self._own_reward = RewardRunner(self.score, cfg.reward_timeout_s)

    @abc.abstractmethod
    def examples(self) -> list[Example]:
        """The whole dataset, in a fixed order; invalid data raises ValueError here."""

    def test_examples(self) -> list[Example]:
        """The held-out split, disjoint from `examples()`; a task without one raises ValueError."""
        raise ValueError(f"task {self.name!r} has no held-out split (split=test); evaluate split=train")

    def split_examples(self, split: str) -> list[Example]:
        check(split in SPLITS, "split", split, f"must be one of {SPLITS}")
        return self.examples() if split == "train" else self.test_examples()

    @abc.abstractmethod
    async def score(self, prompt: Prompt, completion_text: str, completion_ids: list[int]) -> float:
        """The task's own reward for one completion of `prompt` (may raise; `reward` contains it).
        It runs in-process on the event loop: string work only. A verifier that may be slow or
        hang sets `isolated_score` instead (tasks/rewards.py)."""

    async def reward(self, prompt: Prompt, completion_text: str, completion_ids: list[int]) -> RewardResult:
        """What the runtime calls: the user's `reward_fn` if configured, else `isolated_score`, else
        `score`; never raises (a failure is the fallback with its reason, tasks/rewards.py)."""
        if self.cfg.reward_fn is not None:
            return await self._pool(prompt.meta["content"], completion_text, prompt.answer)
        if self._pool is not None:
            return await self._pool(prompt.answer, completion_text)
        return await self._own_reward(prompt, completion_text, completion_ids)

    def make_stream(self, tokenizer: Tokenizer, chat_template: str | None, *, seed: int,
                    shuffle: bool = True, num_epochs: int | None = None) -> PromptStream:
        """Tokenized prompts of `examples()`; `chat_template` None sends the raw content."""
        return PromptStream(self.examples(), self.encoder(tokenizer, chat_template), seed=seed, shuffle=shuffle,
                            num_epochs=num_epochs)

    @staticmethod
    def encoder(tokenizer: Tokenizer, chat_template: str | None) -> Callable[[Example], Prompt]:
        """Example -> Prompt as the model sees it: the chat template applied to the content (None:
        the raw content), tokenized. Training and evaluation share it."""
        if chat_template is not None and chat_template != tokenizer.chat_template:
            tokenizer = dataclasses.replace(tokenizer, chat_template=chat_template)

        def encode(example: Example) -> Prompt:
            if chat_template is None:
                text, ids = example.content, tokenizer.encode(example.content)
            else:
                text = tokenizer.apply_chat_template(
                    [{"role": "user", "content": example.content}], add_generation_prompt=True)
                # Templates write their own BOS/special tokens, as transformers' tokenize=True does.
                ids = tokenizer.encode(text, add_bos=False)
            return Prompt(example.prompt_id, text, ids, example.answer,
                          {**example.meta, "content": example.content})

        return encode


class HeldOutSplit(Task):
    """A task whose items (operand pairs, secrets, ...) come in one order fixed by its data seed:
    the first `cfg.num_test_prompts` are the held-out split, the rest the training split, so no
    training prompt is ever scored by `python -m jaxrl_async.eval`. Subclasses implement `items`
    and `make_examples`, and their config has `num_test_prompts`; `items_name` names the items
    in the no-split error."""

    items_name: ClassVar[str] = "items"

    @abc.abstractmethod
    def items(self) -> list[Any]:
        """Every item, in the seeded order (the same on every call)."""

    @abc.abstractmethod
    def make_examples(self, items: list[Any], split: str) -> list[Example]:
        """The examples of `items`, which belong to `split`."""

    def examples(self) -> list[Example]:
        return self.make_examples(self.items()[self.cfg.num_test_prompts:], "train")

    def test_examples(self) -> list[Example]:
        if not self.cfg.num_test_prompts:
            raise ValueError(f"task.num_test_prompts=0: no {self.items_name} are held out for split=test")
        return self.make_examples(self.items()[: self.cfg.num_test_prompts], "test")


TASKS: dict[str, type[Task]] = {}


def register_task(cls: type[Task]) -> type[Task]:
    """Class decorator: add `cls` to TASKS under `cls.name`; a second class of that name raises."""
    if cls.name in TASKS:
        raise ValueError(f"task name {cls.name!r} registered twice: {TASKS[cls.name].__qualname__} "
                         f"and {cls.__qualname__}")
    TASKS[cls.name] = cls
    return cls


def task_config(cfg: Mapping[str, Any]) -> TaskConfig:
    """`{"name": <registered task>, **its config keys}` (a `conf/task/*.yaml`) -> the task's typed
    config; every key checked, no file read."""
    values = dict(cfg)
    name = values.pop("name", None)
    check(name in TASKS, "task.name", name, f"not a registered task; registered: {sorted(TASKS)}")
    return build(TASKS[name].config_class, values, "task", what=f"key for task {name!r}")


def build_task(cfg: Mapping[str, Any]) -> Task:
    """`{"name": <registered task>, **its config keys}` (a `conf/task/*.yaml`) -> the task."""
    config = task_config(cfg)
    return TASKS[cfg["name"]](config)
