"""`reasoning_gym`: any reasoning-gym dataset as a task, scored by the dataset's own `score_answer`.

Data: `reasoning_gym.create_dataset(task.dataset, seed=task.seed, size=task.size +
task.num_test_prompts, **task.dataset_args)`. Its items 0..size-1 are the training split; the
next `num_test_prompts` items are the held-out split, less any whose question text is also a
training question (left out, with a warning that counts them). Why the tail of one generation
and not a second seed: reasoning-gym generates item i from `Random(seed + i)`, so the dataset
under seed s+1 is the one under seed s shifted by one item (49 of 50 `basic_arithmetic`
questions shared). Items past the training ones never reuse a training item's generator, and
the question-text check removes what a small question space still repeats. `dataset=composite`
mixes datasets (`task.dataset_args={datasets: [{name: chain_sum, weight: 1, config: {}}, ...]}`,
the specs of reasoning-gym's composite YAML); its item i is item i of one of them.

Prompt: the entry's question, a blank line, then `instruction`, which asks for the final answer
inside `<answer></answer>` tags. That is what reasoning-gym's own evaluation extracts
(`reasoning_gym.utils.extract_answer`: the last tagged span, stripped; None without one) and
passes to `score_answer(answer, entry)`; the reward is that score (1.0 right, 0.0 wrong or
untagged, partial credit where the dataset gives it).

Scoring is the dataset's own code (some datasets parse, simulate or search to score), so it runs
in the killable reward worker processes (`Task.isolated_score`, tasks/reward_pool.py): a hung
score costs one reward. `Example.answer` carries what a worker needs — the dataset's name, its
full config and the entry — and each worker builds the dataset once per config to call its
`score_answer`. `Example.meta["entry"]` is reasoning-gym's record (question, answer, metadata),
for the samples a run shows.

reasoning-gym is the optional extra `envs` (`pip install -e ".[envs]"`). It is imported when the
data is generated or a completion scored, never by `--help` or another task: its import takes
over a second.
"""

from __future__ import annotations

import difflib
import json
import logging
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from jaxrl_async.tasks.base import Example, Prompt, Task, TaskConfig, register_task
from planner.configs import check

log = logging.getLogger(__name__)

INSTALL = 'task=reasoning_gym needs the reasoning-gym package: pip install -e ".[envs]"'
# Paraphrases reasoning-gym's "default" system prompt (reasoning_gym.utils.SYSTEM_PROMPTS): the
# encoder sends one user message, so the request for tags follows the question.
INSTRUCTION = ("Think step by step, then give the final answer in the format <answer>answer here</answer>. "
               "Put only the final answer inside the tags, in the format the question asks for.")
OWN_KEYS = ("seed", "size")  # dataset config keys this task sets itself (task.seed, task.size)


@dataclass(frozen=True, kw_only=True)
class ReasoningGymConfig(TaskConfig):
    """`task=reasoning_gym`: a reasoning-gym dataset, scored by its own score_answer (`pip install -e ".[envs]"`).

    Attributes:
      dataset: the dataset's name in reasoning-gym's registry (e.g. chain_sum, basic_arithmetic,
        leg_counting, spell_backward).
      dataset_args: the dataset's own config keys, e.g. 'task.dataset_args={min_terms: 2,
        max_terms: 3}'; null: the dataset's defaults. Its seed and size are task.seed and
        task.size.
      size: training prompts: the dataset's items 0..size-1.
      num_test_prompts: held-out prompts (split=test): the next items, less any whose question is
        also a training question.
      seed: the dataset's seed (reasoning-gym generates item i from seed + i).
      instruction: appended to each question (after a blank line); asks for the <answer></answer>
        tags that the score reads.
    """

    dataset: str = "chain_sum"
    dataset_args: dict | None = None
    size: int = 1000
    num_test_prompts: int = 100
    seed: int = 0
    instruction: str = INSTRUCTION

    def __post_init__(self) -> None:
        super().__post_init__()
        check(bool(self.dataset), "task.dataset", self.dataset, "must name a reasoning-gym dataset")
        check(self.size >= 1, "task.size", self.size, "must be an int >= 1")
        check(self.num_test_prompts >= 1, "task.num_test_prompts", self.num_test_prompts, "must be an int >= 1")
        for key in OWN_KEYS:
            check(key not in self.args, f"task.dataset_args.{key}", self.args.get(key),
                  f"set task.{key} instead (the task sets the dataset's {key})")

    @property
    def args(self) -> dict[str, Any]:
        """`dataset_args`, null read as none. (A null default, not an empty mapping, is what lets
        Hydra take `task.dataset_args={...}` on the command line: it refuses new keys in a mapping.)"""
        return dict(self.dataset_args or {})

    def dataset_config(self) -> dict[str, Any]:
        """The keyword arguments of `create_dataset`: both splits' items under one seed."""
        return {**self.args, "seed": self.seed, "size": self.size + self.num_test_prompts}


@register_task
class ReasoningGymTask(Task):
    name = "reasoning_gym"
    config_class = ReasoningGymConfig
    cfg: ReasoningGymConfig
    # The dataset's own code: in the killable reward workers (module docstring).
    isolated_score = "jaxrl_async.tasks.reasoning_gym:score_completion"

    def __init__(self, cfg: ReasoningGymConfig) -> None:
        super().__init__(cfg)
        self._splits: tuple[list[Example], list[Example]] | None = None

    def examples(self) -> list[Example]:
        return self._generated()[0]

    def test_examples(self) -> list[Example]:
        return self._generated()[1]

    def _generated(self) -> tuple[list[Example], list[Example]]:
        if self._splits is None:
            self._splits = generate_splits(self.cfg)
        return self._splits

    async def score(self, prompt: Prompt, completion_text: str, completion_ids: list[int]) -> float:
        return score_completion(prompt.answer, completion_text)  # unused: `isolated_score` replaces it


def generate_splits(cfg: ReasoningGymConfig) -> tuple[list[Example], list[Example]]:
    """(training, held-out) examples of the dataset (module docstring: the tail of one generation)."""
    config = cfg.dataset_config()
    dataset = create(cfg.dataset, config)
    try:
        entries = [dataset[i] for i in range(config["size"])]
    except (TypeError, ValueError, AssertionError, KeyError, IndexError) as e:
        raise ValueError(f"task.dataset_args={cfg.args!r}: dataset {cfg.dataset!r} failed to generate "
                         f"an item with them ({type(e).__name__}: {first_line(e)})") from None
    seen = {entry["question"] for entry in entries[:cfg.size]}
    held_out = [i for i in range(cfg.size, len(entries)) if entries[i]["question"] not in seen]
    if not held_out:
        raise ValueError(f"task.num_test_prompts={cfg.num_test_prompts}: every held-out question of dataset "
                         f"{cfg.dataset!r} is also a training question (its question space is small): lower "
                         "task.size or widen task.dataset_args")
    if len(held_out) < cfg.num_test_prompts:
        log.warning("task=reasoning_gym: %d of task.num_test_prompts=%d held-out questions of %r are also "
                    "training questions and are left out", cfg.num_test_prompts - len(held_out),
                    cfg.num_test_prompts, cfg.dataset)

    def example(index: int) -> Example:
        entry = entries[index]
        return Example(f"reasoning_gym-{cfg.dataset}-{index}", f"{entry['question'].strip()}\n\n{cfg.instruction}",
                       {"dataset": cfg.dataset, "config": config, "entry": entry}, {"entry": entry})

    return [example(i) for i in range(cfg.size)], [example(i) for i in held_out]


def create(name: str, config: dict[str, Any]) -> Any:
    """`reasoning_gym.create_dataset(name, **config)`; a name or config it refuses is a one-line
    ValueError naming the key."""
    try:
        import reasoning_gym
        from reasoning_gym.factory import DATASETS
    except ModuleNotFoundError as e:
        if e.name != "reasoning_gym":
            raise
        raise ValueError(INSTALL) from None
    if name not in DATASETS:
        close = difflib.get_close_matches(name, DATASETS, n=3)
        hint = f"did you mean {', '.join(close)}? " if close else ""
        raise ValueError(f"task.dataset={name!r}: not a reasoning-gym dataset; {hint}it has {len(DATASETS)}, "
                         f"e.g. {', '.join(sorted(DATASETS)[:6])}")
    args = {k: v for k, v in config.items() if k not in OWN_KEYS}
    if name == "composite":
        config = composite_config(config)
    try:
        return reasoning_gym.create_dataset(name, **config)
    except (TypeError, ValueError, AssertionError, KeyError) as e:  # the config class's own refusals
        raise ValueError(f"task.dataset_args={args!r}: dataset {name!r} refuses them "
                         f"({type(e).__name__}: {first_line(e)})") from None


def composite_config(config: dict[str, Any]) -> dict[str, Any]:
    """`dataset=composite` (a weighted mixture of datasets): its `datasets` list as reasoning-gym
    reads it from YAML, each mapping made a `DatasetSpec`."""
    from reasoning_gym.composite import DatasetSpec

    specs = config.get("datasets")
    check(isinstance(specs, list) and bool(specs)
          and all(isinstance(s, dict) and set(s) == {"name", "weight", "config"} for s in specs),
          "task.dataset_args.datasets", specs, "dataset=composite needs a list of {name: NAME, weight: W, config: {...}}")
    return {**config, "datasets": [DatasetSpec(**spec) for spec in specs]}


def first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else "no message"


@lru_cache(maxsize=8)
def _score_answer(name: str, config_json: str):
    """A reward worker's dataset for one config, built once (its `score_answer` may read the config)."""
    return create(name, json.loads(config_json)).score_answer


def score_completion(answer: dict[str, Any], completion_text: str) -> float:
    """The reward, in a reward worker: the dataset's `score_answer` of the tagged answer, extracted
    as reasoning-gym's own evaluation extracts it."""
    from reasoning_gym.utils import extract_answer

    score_answer = _score_answer(answer["dataset"], json.dumps(answer["config"], sort_keys=True))
    return float(score_answer(extract_answer(completion_text), answer["entry"]))
