"""Plots of a run or a comparison, from the files a run writes (`summary.json`, `metrics.jsonl`,
`ledger.jsonl`), so the same functions serve simulated and real runs: both
drivers write those files with `planner.run_files`' keys.

Each function draws one figure into one file; matplotlib runs headless (Agg). `run_plots` draws a
run directory's two plots.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from planner.ledger import read_ledger  # noqa: E402
from planner.run_files import METRICS_FILE, SUMMARY_FILE  # noqa: E402
from planner.sim.metrics import read_steps  # noqa: E402


def _save(fig: Any, path: str | Path) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def staleness_histogram(summary: Mapping[str, Any], path: str | Path) -> None:
    hist = {int(k): v for k, v in summary["staleness_histogram"].items()}
    fig, ax = plt.subplots(figsize=(5, 3.2))
    ax.bar(list(hist), list(hist.values()), color="tab:blue")
    eta = summary.get("max_staleness")
    if eta is not None:
        ax.axvline(eta + 0.5, color="tab:red", ls="--", label=f"η = {eta}")
        ax.legend()
    ax.set_xlabel("token staleness (train step − generation version)")
    ax.set_ylabel("trained tokens")
    ax.set_title(f"{summary['policy']}: staleness of trained tokens")
    _save(fig, path)


def utilisation(steps: Sequence[Mapping[str, Any]], path: str | Path, title: str = "") -> None:
    """Trainer busy/wait intervals (top) and active sequences per worker at each step end (bottom)."""
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 4.5), sharex=True)
    top.broken_barh([(r["start_s"], r["end_s"] - r["start_s"]) for r in steps], (0.55, 0.4), color="tab:green")
    top.broken_barh([(r["start_s"] - r["wait_s"], r["wait_s"]) for r in steps], (0.05, 0.4), color="tab:orange")
    top.set_yticks([0.25, 0.75], ["waiting", "training"])
    top.set_title(title or "trainer and generators over time")
    if steps:
        t = [r["end_s"] for r in steps]
        per_worker = list(zip(*[r["gen_active"] for r in steps]))
        for i, series in enumerate(per_worker):
            bottom.step(t, [max(0, a) for a in series], where="post", label=f"worker {i}", lw=1)
        if len(per_worker) <= 8:
            bottom.legend(fontsize=7, ncol=4)
    bottom.set_xlabel("time (s)")
    bottom.set_ylabel("active sequences")
    _save(fig, path)


def run_plots(run_dir: str | Path, out_dir: str | Path | None = None) -> list[Path]:
    """`staleness_hist.png` and `utilisation.png` of one run directory, simulated or training, from
    its `summary.json` and `metrics.jsonl`, into `out_dir` (default: the run directory)."""
    run_dir = Path(run_dir)
    out = Path(out_dir) if out_dir is not None else run_dir
    summary = json.loads((run_dir / SUMMARY_FILE).read_text(encoding="utf-8"))
    steps = read_steps(run_dir / METRICS_FILE)
    paths = [out / "staleness_hist.png", out / "utilisation.png"]
    staleness_histogram(summary, paths[0])
    utilisation(steps, paths[1], title=f"{summary['policy']}, η={summary['max_staleness']}")
    return paths


def throughput_vs_eta(rows: Sequence[Mapping[str, Any]], path: str | Path, title: str = "") -> None:
    """rows: workload-filtered compare rows with policy, eta, steps_per_hour, ceiling, bound."""
    fig, ax = plt.subplots(figsize=(6, 4))
    for policy in sorted({r["policy"] for r in rows}):
        pts = sorted((r["eta"], r["steps_per_hour"]) for r in rows if r["policy"] == policy)
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=policy)
    etas = sorted({r["eta"] for r in rows})
    bound = {r["eta"]: r["no_drop_bound"] for r in rows}
    ax.plot(etas, [bound[e] for e in etas], "k:", label="no-drop upper bound")
    ax.axhline(rows[0]["unbounded_ceiling"], color="gray", ls="--", label="unbounded (async ceiling)")
    ax.set_xlabel("η (max staleness)")
    ax.set_ylabel("steps per hour")
    ax.set_title(title)
    ax.legend(fontsize=7)
    _save(fig, path)


def staleness_histograms(summaries: Mapping[str, Mapping[str, Any]], path: str | Path, title: str = "") -> None:
    """One panel per label (e.g. policy), bars per staleness."""
    labels = list(summaries)
    fig, axes = plt.subplots(1, len(labels), figsize=(2.6 * len(labels) + 1, 3), squeeze=False, sharey=True)
    for ax, label in zip(axes[0], labels):
        hist = {int(k): v for k, v in summaries[label]["staleness_histogram"].items()}
        total = sum(hist.values()) or 1
        ax.bar(list(hist), [v / total for v in hist.values()])
        ax.set_title(label, fontsize=8)
        ax.set_xlabel("staleness")
    axes[0][0].set_ylabel("fraction of trained tokens")
    fig.suptitle(title)
    _save(fig, path)


def schedule_gantt(ledger_path: str | Path, path: str | Path, max_groups: int = 60) -> None:
    """The planner's schedule from the ledger: per group (rows, admission order) its window
    [admission version, deadline] as a bar, each planned step it was moved to as a dot, reassignments as
    arrows, and the step that trained it as a cross."""
    rows: dict[int, dict[str, Any]] = {}
    for ev in read_ledger(ledger_path):
        kind, uid = ev["event"], ev.get("uid")
        if kind == "admit" and uid not in rows and len(rows) < max_groups:
            rows[uid] = {"a": ev["version"], "d": ev["deadline"], "moves": [], "trained": None}
        elif kind == "move" and uid in rows:
            rows[uid]["moves"].append((ev["from"], ev["to"]))
        elif kind == "train":
            for g in ev["groups"]:
                if g["uid"] in rows:
                    rows[g["uid"]]["trained"] = ev["step"]
    fig, ax = plt.subplots(figsize=(8, max(3, 0.12 * len(rows) + 1)))
    for y, (uid, r) in enumerate(rows.items()):
        if r["d"] is not None:
            ax.barh(y, r["d"] - r["a"] + 1, left=r["a"] - 0.5, height=0.6, color="tab:blue", alpha=0.25)
        for src, dst in r["moves"]:
            if src >= 0:
                ax.annotate("", (dst, y), (src, y), arrowprops={"arrowstyle": "->", "color": "tab:orange", "lw": 0.8})
            ax.plot(dst, y, ".", color="tab:orange", ms=4)
        if r["trained"] is not None:
            ax.plot(r["trained"], y, "x", color="tab:green", ms=5)
    ax.set_yticks(range(len(rows)), [str(u) for u in rows], fontsize=5)
    ax.invert_yaxis()
    ax.set_xlabel("trainer step")
    ax.set_ylabel("group uid (admission order)")
    ax.set_title("schedule: window (bar), planned step moves (→), trained (x)")
    _save(fig, path)
