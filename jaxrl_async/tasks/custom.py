"""`custom`: your prompts from a JSONL file, scored by your `reward_fn` or by exact match.

Data: one `{"prompt": str, "answer": <any JSON value, optional>}` a line (extra fields go to
`Prompt.meta`). Without `reward_fn` the reward is 1.0 when the stripped completion equals
`str(answer)`, else 0.0; set `reward_fn=pkg.module:function` for anything else (see base.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from jaxrl_async.tasks.base import Example, Prompt, Task, TaskConfig, register_task
from jaxrl_async.tasks.jsonl import read_jsonl
from planner.configs import check


@dataclass(frozen=True, kw_only=True)
class CustomConfig(TaskConfig):
    """`task=custom`: the user's prompts (and optional answers) from a JSONL file.

    Attributes:
      path: required: JSONL of {"prompt": str, "answer": any (optional), ...}; the other keys go
        into the example's meta
      test_path: the held-out split (split=test of python -m jaxrl_async.eval), same format; None:
        none
    """

    path: str | None = None
    test_path: str | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        check(self.path is not None, "task.path", self.path,
              "task 'custom' needs a JSONL file of " '{"prompt": ..., "answer": ...} lines (task.path=FILE)')


@register_task
class CustomTask(Task):
    name = "custom"
    config_class = CustomConfig
    cfg: CustomConfig

    def examples(self) -> list[Example]:
        return self._read(Path(self.cfg.path))

    def test_examples(self) -> list[Example]:
        if self.cfg.test_path is None:
            raise ValueError("task.test_path=None: split=test needs a held-out JSONL of the same format "
                             "(task.test_path=FILE)")
        return self._read(Path(self.cfg.test_path))

    def _read(self, path: Path) -> list[Example]:
        examples = []
        for number, row in read_jsonl(path, {"prompt": str}):
            meta = {k: v for k, v in row.items() if k not in ("prompt", "answer")}
            examples.append(Example(f"custom-{path.stem}-{number}", row["prompt"], row.get("answer"), meta))
        return examples

    async def score(self, prompt: Prompt, completion_text: str, completion_ids: list[int]) -> float:
        return float(prompt.answer is not None and completion_text.strip() == str(prompt.answer))
