"""`samples.jsonl`: a few trained samples of every step, in a form a person can read.

One JSON object a sample, written when its step's batch goes to the trainer (so every line is of a
trained, scored sample): the step, the group's uid and prompt id, the sample's index, the
conversation as chat messages (an episode's own messages; for a single-turn task the user's
question and the decoded completion), the completion's `token_ids` with their `loss_mask` (0 for an
environment's tokens) and `versions`, per-turn timing `[queued_s, gen_s, env_s]`, the `reward` with
the rubric's `terms`, `extracted_answer` (the text the scorer saw, when the task says it), `entry`
(the task's own record of the prompt) and, for an episode that ended on one, its `fault`.

A resumed run cuts the file back to the checkpoint's length, as it does the ledger and the metrics
(runtime/state.py), so a step is never written twice.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from planner.jsonl import JsonlWriter

SAMPLES_FILE = "samples.jsonl"


def sample_line(step: int, prompt: Any, rollout: Any, index: int, tokenizer: Any) -> dict[str, Any]:
    """The line of sample `index` of `rollout` (trained at `step`), its `prompt` the task's."""
    sample = rollout.samples[index]
    record = sample.episode
    result = record.result if record is not None else None
    meta = {k: v for k, v in prompt.meta.items() if k != "content"}
    if result is not None and result.messages:
        messages = result.messages
    else:
        messages = [{"role": "user", "content": prompt.meta.get("content", prompt.text)},
                    {"role": "assistant", "content": tokenizer.decode(sample.token_ids)}]
    return {
        "step": step, "uid": rollout.uid, "prompt_id": prompt.prompt_id, "sample": index,
        "messages": messages, "token_ids": sample.token_ids, "loss_mask": sample.mask(),
        "versions": sample.versions, "turns": record.turns if record is not None else None,
        "reward": rollout.rewards[index] if rollout.rewards is not None else None,
        "terms": result.terms if result is not None else {},
        "extracted_answer": result.extracted_answer if result is not None else None,
        "entry": meta.get("entry", meta),
        "fault": record.fault if record is not None else None,
    }


class SampleLog:
    """Appends `per_step` samples of each trained batch to `run_dir/samples.jsonl` (0: writes nothing)."""

    def __init__(self, run_dir: Path, per_step: int, tokenizer: Any, *, append: bool) -> None:
        self.per_step, self.tokenizer = per_step, tokenizer
        self._writer = JsonlWriter(Path(run_dir) / SAMPLES_FILE, append=append, buffer_lines=64) if per_step else None

    def write(self, step: int, groups: Sequence[tuple[Any, Any]]) -> None:
        """`groups`: the batch's (prompt, rollout) pairs, in batch order."""
        if self._writer is None:
            return
        picked = [(p, r, i) for i in range(max((len(r.samples) for _, r in groups), default=0))
                  for p, r in groups if i < len(r.samples)][: self.per_step]
        for prompt, rollout, index in picked:
            self._writer.append(sample_line(step, prompt, rollout, index, self.tokenizer))

    def flush(self) -> None:
        if self._writer is not None:
            self._writer.flush()

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
