"""GSM8K-format math word problems, rewarded by `math-verify`.

Data: a local JSONL file, one `{"question": str, "answer": str}` a line, the answer ending in
`#### <final answer>` as in the GSM8K release (the reasoning before `####` is not used). The
whole file is read and checked when the stream is built; a bad line is a `ValueError` naming
FILE:LINE. Without `path`, the task uses the 8-problem sample shipped in `tasks/data/`.

Prompt: the question plus `instruction` (ask for the final answer in \\boxed{}), rendered with the
model's chat template. Reward: 1.0 if `math_verify.verify(parse(gold), parse(completion))`, else
0.0. math-verify's own timeouts use SIGALRM, which works only on the main thread, so they are off;
the reward runs in the killable reward worker processes and `reward_timeout_s` bounds it.
math-verify imports sympy (most of a second), so it is imported where a completion is judged:
the config is read by `--help`, which answers at once.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from jaxrl_async.tasks.base import Example, Prompt, Task, TaskConfig, register_task
from jaxrl_async.tasks.jsonl import read_jsonl

SAMPLE_PATH = Path(__file__).parent / "data" / "gsm8k_sample.jsonl"


@dataclass(frozen=True, kw_only=True)
class GSM8KConfig(TaskConfig):
    """`task=gsm8k`: GSM8K-format math word problems from a JSONL file.

    Attributes:
      path: GSM8K-format JSONL; None: the sample in jaxrl_async/tasks/data/
      test_path: the held-out split (e.g. GSM8K's test.jsonl); None: none
      instruction: Appended to each question (after a blank line).
    """

    path: str | None = None
    test_path: str | None = None
    instruction: str = "Please reason step by step, and put your final answer within \\boxed{}."


def final_answer(answer: str) -> str | None:
    """The text after the last `####` with thousands separators removed, or None if absent."""
    head, sep, tail = answer.rpartition("####")
    final = tail.strip().replace(",", "")
    return final if sep and final else None


@lru_cache(maxsize=4096)
def _parsed_gold(answer: str):
    from math_verify import parse

    return parse(answer, parsing_timeout=None)


def is_correct(answer: str, completion_text: str) -> bool:
    """math-verify's judgement of `completion_text` against the final answer (no timeouts)."""
    from math_verify import parse, verify

    return bool(verify(_parsed_gold(answer), parse(completion_text, parsing_timeout=None),
                       timeout_seconds=None))


@register_task
class GSM8KTask(Task):
    name = "gsm8k"
    config_class = GSM8KConfig
    cfg: GSM8KConfig

    def examples(self) -> list[Example]:
        return self._read(Path(self.cfg.path) if self.cfg.path is not None else SAMPLE_PATH)

    def test_examples(self) -> list[Example]:
        if self.cfg.test_path is None:
            raise ValueError("task.test_path=None: split=test needs a held-out GSM8K-format JSONL (task.test_path=FILE)")
        return self._read(Path(self.cfg.test_path))

    def _read(self, path: Path) -> list[Example]:
        examples = []
        for number, row in read_jsonl(path, {"question": str, "answer": str}):
            final = final_answer(row["answer"])
            if final is None:
                raise ValueError(f"{path}:{number}: field 'answer' has no '#### <final answer>' at its end")
            examples.append(Example(f"gsm8k-{path.stem}-{number}",
                                    f"{row['question'].strip()}\n\n{self.cfg.instruction}", final))
        return examples

    # sympy work that can hang on adversarial input: in the killable reward workers (tasks/reward_pool.py).
    isolated_score = "jaxrl_async.tasks.gsm8k:correctness"

    async def score(self, prompt: Prompt, completion_text: str, completion_ids: list[int]) -> float:
        return correctness(prompt.answer, completion_text)  # unused: `isolated_score` replaces it


def correctness(answer: str, completion_text: str) -> float:
    """The reward: 1.0 if math-verify judges `completion_text` correct, else 0.0."""
    return 1.0 if is_correct(answer, completion_text) else 0.0
