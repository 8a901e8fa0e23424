"""How well a replay predicts its real run (docs/calibration.md): the figures the calibration
benchmark and its CI test compare, read from the two run directories' `metrics.jsonl` (both
drivers write the same keys, docs/design.md §8.3) and the real run's `trace.jsonl`.

Steady state: the figures span the record of step `warmup − 1` to the last record, because the
real run's first steps compile the jitted steps; both runs are measured over the same steps, with
`planner.run_files.steady_steps_per_hour` (the summaries' `steps_per_hour_steady` at warmup 3).
The staleness histograms are whole-run (the last record's).

Two trainer busy fractions of the real run: `trainer_busy` is the runtime's (the optimizer step
alone, `train_s`); `trainer_step_busy` is the trainer's step as the planner and the simulator see
it — batch handed over → version published (trace `train.t` → `publish.t`), which adds the
batch's host-side preparation. The simulator's `c0 + c1·tokens` is fitted to the latter, so that is
the like-for-like comparison; both are reported.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from planner.run_files import steady_steps_per_hour
from planner.run_trace import TRACE_FILE, read_run_trace


@dataclass(frozen=True)
class RunFigures:
    steps_per_hour: float
    trainer_busy: float  # the driver's own trainer busy fraction over the window
    trainer_step_busy: float | None  # real runs: handed over -> published, over the window
    generator_busy: float
    staleness: dict[int, float]  # whole run: share of trained tokens by staleness


def _records(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        raise ValueError(f"{path}: no such file")
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def figures(run_dir: str | Path, warmup: int) -> RunFigures:
    run_dir = Path(run_dir)
    rows = _records(run_dir)
    if len(rows) <= warmup:
        raise ValueError(f"{run_dir}: {len(rows)} steps, need more than warmup={warmup}")
    a, b = rows[warmup - 1] if warmup else None, rows[-1]
    t0 = a["elapsed_s"] if a else 0.0
    span = b["elapsed_s"] - t0

    def frac(key: str) -> float:
        before = a[key] * a["elapsed_s"] if a else 0.0
        return (b[key] * b["elapsed_s"] - before) / span

    step_busy = None
    trace = run_dir / TRACE_FILE
    if trace.is_file():
        events = list(read_run_trace(trace))
        published = {e["version"]: e["t"] for e in events if e["event"] == "publish"}
        busy = 0.0
        for e in events:
            if e["event"] == "train" and e["step"] >= warmup:
                busy += published.get(e["step"] + 1, e["end"]) - e["t"]
        step_busy = busy / span
    hist = {int(k): v for k, v in b["staleness_hist"].items()}
    total = sum(hist.values()) or 1
    return RunFigures(steady_steps_per_hour([r["elapsed_s"] for r in rows], warmup), frac("trainer_busy"), step_busy, frac("generator_busy"),
                      {k: v / total for k, v in sorted(hist.items())})


def total_variation(p: dict[int, float], q: dict[int, float]) -> float:
    return 0.5 * sum(abs(p.get(k, 0.0) - q.get(k, 0.0)) for k in set(p) | set(q))


def compare(real_dir: str | Path, sim_dir: str | Path, warmup: int = 3) -> dict[str, Any]:
    """Real vs predicted figures, and the errors the calibration targets bound."""
    real, sim = figures(real_dir, warmup), figures(sim_dir, warmup)
    return {
        "real": asdict(real), "sim": asdict(sim),
        "steps_per_hour_error": sim.steps_per_hour / real.steps_per_hour - 1,
        "trainer_busy_error": sim.trainer_busy - (real.trainer_step_busy if real.trainer_step_busy is not None
                                                  else real.trainer_busy),
        "trainer_busy_error_runtime": sim.trainer_busy - real.trainer_busy,
        "generator_busy_error": sim.generator_busy - real.generator_busy,
        "staleness_tv": total_variation(real.staleness, sim.staleness),
    }
