"""The simulator's run metrics: what was trained, dropped and wasted, and its two output files.

Both files have the runtime's keys, built by `planner.run_files`, so `planner.plots`
reads either driver's runs:

- `summary.json`: `run_files.summary` — the docs/design.md §8 keys (`run_files.SUMMARY_KEYS`) first, then the
  simulator's extensions (`trajectories_trained`, `drops_by_reason`, `length_bias`, and the
  engine's). `length_bias` compares the workload's true lengths of every admitted group with the
  trained groups' (`planner.length_bias`): the truth the audit estimates from the ledger. Staleness
  counts only what was trained: each trained token has staleness `train step − its version`, and
  the histogram counts tokens.
- `metrics.jsonl`: one `run_files.step_record` per trainer step (`reward_mean` and `loss` are null:
  there is no model), plus the simulator's extensions `tokens` and `inflight`.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from planner import run_files
from planner.run_files import METRICS_FILE, SUMMARY_FILE
from planner.length_bias import length_bias
from planner.versions import add_staleness


class RunMetrics:
    """Accumulates what was trained, dropped and wasted; builds the summary and step rows."""

    def __init__(self) -> None:
        self.histogram: dict[int, int] = {}  # staleness -> trained tokens
        self.tokens_wasted = 0
        self.groups_trained = 0
        self.trajectories_trained = 0
        self.drops: Counter[str] = Counter()
        self.steps: list[dict[str, Any]] = []
        self.admitted_lengths: list[int] = []  # true completion length of every admitted group
        self.trained_lengths: list[int] = []  # trained tokens of every trained group

    def admit(self, length: int) -> None:
        """A first admission of a group whose completion will be `length` tokens."""
        self.admitted_lengths.append(length)

    def train(self, step: int, batch: Sequence[tuple[int, Sequence[tuple[int, int]], int]]) -> dict[int, int]:
        """batch: (uid, versions, trajectories). Returns the batch's trained tokens by staleness."""
        hist: dict[int, int] = {}
        for _, versions, trajectories in batch:
            self.trajectories_trained += trajectories
            self.trained_lengths.append(sum(t for _, t in versions))
            add_staleness(hist, step, versions)
        for s, t in hist.items():
            self.histogram[s] = self.histogram.get(s, 0) + t
        self.groups_trained += len(batch)
        return hist

    def drop(self, reason: str, tokens: int) -> None:
        self.drops[reason] += 1
        self.tokens_wasted += tokens

    def waste(self, tokens: int) -> None:
        """Tokens thrown away without a drop (a group regenerated after a fault)."""
        self.tokens_wasted += tokens

    def step_row(self, *, tokens: int, inflight: int, **common: Any) -> None:
        """One metrics.jsonl row: `run_files.step_record(**common)` plus the simulator's extensions."""
        self.steps.append(run_files.step_record(reward_mean=None, loss=None, staleness=self.histogram, **common,
                                             extensions={"tokens": tokens, "inflight": inflight}))

    def summary(
        self, *, policy: str, max_staleness: int | None, staleness_bound: int | None, steps: int, groups_admitted: int, elapsed_s: float,
        trainer_busy_s: float, generator_busy_s: Sequence[float], **extras: Any,
    ) -> dict[str, Any]:
        """`run_files.summary` with the simulator's extensions; `generator_busy_s` is per worker."""
        return run_files.summary(
            policy=policy, max_staleness=max_staleness, staleness_bound=staleness_bound, steps=steps, groups_admitted=groups_admitted,
            groups_trained=self.groups_trained, groups_dropped=sum(self.drops.values()),
            tokens_wasted=self.tokens_wasted, staleness=self.histogram, elapsed_s=elapsed_s,
            trainer_busy_s=trainer_busy_s, generator_busy_s=sum(generator_busy_s) / len(generator_busy_s),
            record_s=[row["elapsed_s"] for row in self.steps],
            extensions={"trajectories_trained": self.trajectories_trained,
                        "drops_by_reason": dict(sorted(self.drops.items())),
                        "length_bias": length_bias(self.admitted_lengths, self.trained_lengths), **extras},
        )


def write_outputs(out_dir: str | Path, summary: dict[str, Any], steps: Sequence[dict[str, Any]]) -> None:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / SUMMARY_FILE).write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    with open(out_dir / METRICS_FILE, "w", encoding="utf-8") as fh:
        for row in steps:
            fh.write(json.dumps(row, separators=(",", ":")) + "\n")


def read_steps(path: str | Path) -> list[dict[str, Any]]:
    with open(path, encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]
