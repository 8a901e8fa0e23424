"""Run metrics with one key scheme for the simulator and the runtime (STYLE brief 14).

Two outputs, both read by `planner.plots` whichever driver wrote them:

- `summary.json`: the DESIGN §8 keys (`SUMMARY_KEYS`, in that order) plus extras. Staleness
  counts only what was trained: each trained token has staleness `train step − its version`,
  and the histogram counts tokens.
- `metrics.jsonl`: one row per trainer step. The runtime's required keys (`step`,
  `max_staleness_in_batch`, `tokens_per_s`; `reward_mean`/`loss` only exist in training) plus the
  time series the utilisation plot needs: when the step started and ended, how long the trainer
  waited before it, and per-worker active sequences sampled at the step's end (`STEP_KEYS`).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

SUMMARY_FILE = "summary.json"
METRICS_FILE = "metrics.jsonl"

SUMMARY_KEYS = (
    "policy", "max_staleness", "steps", "groups_admitted", "groups_trained", "groups_dropped",
    "tokens_trained", "tokens_wasted", "max_token_staleness", "mean_token_staleness",
    "staleness_histogram", "elapsed_s", "trainer_busy_fraction", "generator_busy_fraction",
    "steps_per_hour",
)

STEP_KEYS = (
    "step", "max_staleness_in_batch", "mean_staleness_in_batch", "tokens_per_s", "tokens",
    "start_s", "end_s", "wait_s", "gen_active", "inflight", "kv_usage",
)


class RunMetrics:
    """Accumulates what was trained, dropped and wasted; builds the summary and step rows."""

    def __init__(self) -> None:
        self.histogram: Counter[int] = Counter()  # staleness -> trained tokens
        self.tokens_trained = 0
        self.tokens_wasted = 0
        self.groups_trained = 0
        self.trajectories_trained = 0
        self.drops: Counter[str] = Counter()
        self.steps: list[dict[str, Any]] = []

    def train(self, step: int, batch: Sequence[tuple[int, Sequence[tuple[int, int]], int]]) -> tuple[int, float, int]:
        """batch: (uid, versions, trajectories). Returns (max staleness, mean staleness, tokens)."""
        worst, weighted, tokens = 0, 0, 0
        hist = self.histogram
        for _, versions, trajectories in batch:
            self.trajectories_trained += trajectories
            for v, t in versions:
                s = step - v
                hist[s] += t
                tokens += t
                weighted += s * t
                if s > worst:
                    worst = s
        self.groups_trained += len(batch)
        self.tokens_trained += tokens
        return worst, (weighted / tokens if tokens else 0.0), tokens

    def drop(self, reason: str, tokens: int) -> None:
        self.drops[reason] += 1
        self.tokens_wasted += tokens

    def waste(self, tokens: int) -> None:
        """Tokens thrown away without a drop (a group regenerated after a fault)."""
        self.tokens_wasted += tokens

    def step_row(self, **row: Any) -> None:
        self.steps.append({k: row[k] for k in STEP_KEYS})

    def summary(
        self, *, policy: str, max_staleness: int | None, steps: int, groups_admitted: int, elapsed_s: float,
        trainer_busy_s: float, generator_busy_s: Sequence[float], **extras: Any,
    ) -> dict[str, Any]:
        total = sum(self.histogram.values())
        mean = sum(s * t for s, t in self.histogram.items()) / total if total else 0.0
        elapsed = max(elapsed_s, 1e-12)
        out = {
            "policy": policy,
            "max_staleness": max_staleness,
            "steps": steps,
            "groups_admitted": groups_admitted,
            "groups_trained": self.groups_trained,
            "groups_dropped": sum(self.drops.values()),
            "tokens_trained": self.tokens_trained,
            "tokens_wasted": self.tokens_wasted,
            "max_token_staleness": max((s for s, t in self.histogram.items() if t), default=0),
            "mean_token_staleness": mean,
            "staleness_histogram": {str(s): self.histogram[s] for s in sorted(self.histogram)},
            "elapsed_s": elapsed_s,
            "trainer_busy_fraction": min(1.0, trainer_busy_s / elapsed),
            "generator_busy_fraction": min(1.0, sum(generator_busy_s) / len(generator_busy_s) / elapsed),
            "steps_per_hour": steps / elapsed * 3600.0,
            "trajectories_trained": self.trajectories_trained,
            "drops_by_reason": dict(sorted(self.drops.items())),
        }
        out.update(extras)
        return out


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
