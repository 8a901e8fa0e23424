"""Plots of a run or a comparison, from the files a run writes (`summary.json`, `metrics.jsonl`,
`ledger.jsonl`, and a training run's `trace.jsonl`), so the same functions serve simulated and
real runs: both drivers write those files with `planner.run_files`' keys.

    python -m planner.plots RUN_DIR [--out DIR]      staleness_hist.png, utilisation.png
                                                     (+ training_curves.png for a training run)

Each function draws one figure into one file; matplotlib runs headless (Agg). `run_plots` draws a
run directory's two plots, and for a training run (its records carry a reward and a loss; the
simulator's are null: it has no model) a third, its curves per step: the batch's mean reward, the
loss, the held-out evaluation's pass@1 and mean reward (`eval.every`; each at the steps its weights
had trained, 0 the base model) and the batch's staleness, max and mean, under η. Active sequences
per worker come from the trace where the run has one (a training run: its metrics' `gen_active` is
sampled at step ends, when the engine is mostly idle), else from the metrics records (the
simulator's, exact at each step end). Warm-up steps that compiled (`compiling_steps`) are drawn
apart from training, so the compile does not read as a slow step.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from planner.ledger import read_ledger  # noqa: E402
from planner.run_files import METRICS_FILE, STEADY_AFTER, SUMMARY_FILE  # noqa: E402
from planner.sim.metrics import read_steps  # noqa: E402
from planner.tools.calibrate import OUTLIER  # noqa: E402
from planner.run_trace import TRACE_FILE, read_run_trace  # noqa: E402

ActiveSeries = list[tuple[list[float], list[float]]]  # per worker: (times, active sequences from then on)


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


def compiling_steps(steps: Sequence[Mapping[str, Any]]) -> set[int]:
    """The warm-up steps (the first `run_files.STEADY_AFTER`) that took more than `calibrate.OUTLIER`×
    the median step (the rule by which calibrate leaves a step out as compiling): a real trainer
    compiles its update there (and a calibrated replay models it, `sim.trainer.compile_s`); later
    long steps are the workload's, not a compile."""
    durations = sorted(r["end_s"] - r["start_s"] for r in steps)
    if len(durations) <= STEADY_AFTER:
        return set()
    median = durations[len(durations) // 2]
    return {r["step"] for r in steps[:STEADY_AFTER] if r["end_s"] - r["start_s"] > OUTLIER * median}


def trace_active(trace_path: str | Path) -> ActiveSeries:
    """Active sequences per worker over time, from a run trace (planner/run_trace.py).

    With `decode` lines (engines that time their iterations): between two step ends, the
    iterations' active sequences weighted by their seconds, over the interval's seconds — the
    engine's mean occupancy, idle time counting 0 (the lines are aggregates, one per step end).
    Without them (vLLM, Ray workers): a group's n samples (the run line's `group_size`) count from
    its attempt's `start` (first token) to its `finish`, `lost` or `drop`, an upper bound between
    its first and its last sample's end."""
    events = list(read_run_trace(trace_path))
    workers = max([int(e["workers"]) for e in events if e["event"] == "run"] or [1])
    decode = [e for e in events if e["event"] == "decode"]
    series: ActiveSeries = []
    if decode:
        flushes = sorted({e["t"] for e in decode})
        for w in range(max(workers, 1 + max(e["worker"] for e in decode))):
            busy = {t: 0.0 for t in flushes}
            for e in decode:
                if e["worker"] == w and e["steps"]:
                    busy[e["t"]] += e["s"] * e["tokens"] / e["steps"]
            t, a, prev = [0.0], [], 0.0
            for when in flushes:
                a.append(busy[when] / max(when - prev, 1e-9))
                t.append(when)
                prev = when
            series.append((t, [*a, 0.0]))
        return series
    n, running = 1, {}  # (uid, attempt) -> worker, of started attempts
    changes: dict[int, list[tuple[float, int]]] = {}
    for e in events:
        kind = e["event"]
        if kind == "run":
            n = int(e["group_size"])
        elif kind == "start":
            running[e["uid"], e["attempt"]] = e["worker"]
            changes.setdefault(e["worker"], []).append((e["t"], n))
        elif kind in ("finish", "lost", "drop"):
            keys = [(e["uid"], e["attempt"])] if kind != "drop" else [k for k in running if k[0] == e["uid"]]
            for key in keys:
                if key in running:
                    changes.setdefault(running.pop(key), []).append((e["t"], -n))
    for w in range(max([workers, *[k + 1 for k in changes]])):
        t, a, level = [0.0], [0], 0
        for when, delta in sorted(changes.get(w, [])):
            level += delta
            t.append(when)
            a.append(level)
        series.append((t, a))
    return series


def utilisation(steps: Sequence[Mapping[str, Any]], path: str | Path, title: str = "", *,
                active: ActiveSeries | None = None) -> None:
    """Trainer intervals (top: training, compiling warm-up steps apart, waiting) and active
    sequences per worker (bottom): `active` when given (a trace's, `trace_active`), else the
    metrics' `gen_active` at each step end."""
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 4.5), sharex=True)
    compiled = compiling_steps(steps)
    for rows, color in (([r for r in steps if r["step"] not in compiled], "tab:green"),
                        ([r for r in steps if r["step"] in compiled], "tab:red")):
        top.broken_barh([(r["start_s"], r["end_s"] - r["start_s"]) for r in rows], (0.55, 0.4), color=color)
    top.broken_barh([(r["start_s"] - r["wait_s"], r["wait_s"]) for r in steps], (0.05, 0.4), color="tab:orange")
    top.set_yticks([0.25, 0.75], ["waiting", "training"])
    if compiled:
        top.legend(handles=[plt.Rectangle((0, 0), 1, 1, color="tab:red")],
                   labels=[f"compiling (step {', '.join(map(str, sorted(compiled)))})"], fontsize=7, loc="upper right")
    top.set_title(title or "trainer and generators over time")
    from_trace = active is not None
    if active is None and steps:
        t = [r["end_s"] for r in steps]
        active = [(t, [max(0, a) for a in series]) for series in zip(*[r["gen_active"] for r in steps])]
    for i, (t, a) in enumerate(active or []):
        bottom.step(t, a, where="post", label=f"worker {i}", lw=1)
    if active and len(active) <= 8:
        bottom.legend(fontsize=7, ncol=4)
    bottom.set_xlabel("time (s)")
    bottom.set_ylabel("active sequences (trace)" if from_trace else "active sequences")
    _save(fig, path)


Series = list[tuple[int, float]]  # (x, y) points; y is nan where the record holds null (a skipped step's loss)


def is_training_run(steps: Sequence[Mapping[str, Any]]) -> bool:
    """Whether the records are a training run's: one with a model has a reward (the simulator's is null)."""
    return any(r.get("reward_mean") is not None for r in steps)


def _value(v: Any) -> float:
    return float("nan") if v is None else float(v)


def training_series(steps: Sequence[Mapping[str, Any]], summary: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """What `training_curves` draws, from a training run's `metrics.jsonl` records: per step the
    batch's `reward_mean`, `loss`, `max_staleness_in_batch` and `mean_staleness_in_batch`; per
    evaluation `eval/pass_at_1` and `eval/mean_reward` at x = `eval/version` (the steps its
    weights had trained: 0 is the base model), with the last evaluation from `summary["eval"]`
    when no step record was left to carry it; and `eta`, the run's `max_staleness` (None: none)."""
    evals = {int(r["eval/version"]): r for r in steps if r.get("eval/pass_at_1") is not None}
    last = (summary or {}).get("eval")
    if last and last.get("eval/pass_at_1") is not None:
        evals.setdefault(int(last["eval/version"]), last)
    return {
        "reward": [(r["step"], _value(r["reward_mean"])) for r in steps],
        "loss": [(r["step"], _value(r["loss"])) for r in steps],
        "max_staleness": [(r["step"], _value(r["max_staleness_in_batch"])) for r in steps],
        "mean_staleness": [(r["step"], _value(r["mean_staleness_in_batch"])) for r in steps],
        "eval_pass_at_1": [(v, _value(evals[v]["eval/pass_at_1"])) for v in sorted(evals)],
        "eval_mean_reward": [(v, _value(evals[v].get("eval/mean_reward"))) for v in sorted(evals)],
        "eval_prompts": max([int(e.get("eval/n") or 0) for e in evals.values()] or [0]),
        "eta": (summary or {}).get("max_staleness"),
    }


def training_figure(series: Mapping[str, Any], title: str = "") -> Any:
    """The figure of `training_series`: four panels over the trainer step — reward, loss, held-out
    evaluation, staleness of the batch (max and mean, η dotted). Returned open, for the caller to
    save (`training_curves`) or to read back."""
    fig, axes = plt.subplots(2, 2, figsize=(9, 5.6), sharex=True)
    (reward, loss), (held_out, staleness) = axes

    def line(ax: Any, points: Series, **kw: Any) -> None:
        ax.plot([x for x, _ in points], [y for _, y in points], **kw)

    line(reward, series["reward"], color="tab:blue", marker=".", label="batch mean reward")
    reward.set_ylabel("reward")
    reward.set_title("reward (mean of the trained batch)", fontsize=9)
    line(loss, series["loss"], color="tab:purple", marker=".", label="loss")
    loss.set_ylabel("loss")
    loss.set_title("loss", fontsize=9)
    if series["eval_pass_at_1"]:
        line(held_out, series["eval_pass_at_1"], color="tab:green", marker="o", label="pass@1 (greedy)")
        line(held_out, series["eval_mean_reward"], color="tab:olive", marker="x", ls="--", label="mean reward")
        held_out.legend(fontsize=7)
    else:
        held_out.text(0.5, 0.5, "no evaluation in this run\n(eval.every=0)", ha="center", va="center",
                      transform=held_out.transAxes, fontsize=8, color="gray")
    held_out.set_ylim(-0.03, 1.03)
    held_out.set_ylabel("held-out score")
    n = series["eval_prompts"]
    held_out.set_title("held-out eval" + (f" ({n} prompts)" if n else "") + " of the weights after x steps",
                       fontsize=9)
    line(staleness, series["mean_staleness"], color="tab:orange", lw=2.5, label="mean over tokens")
    line(staleness, series["max_staleness"], color="tab:red", marker="s", ms=2.5, lw=0.8, label="max")
    top = max([y for _, y in series["max_staleness"] if y == y] + [0])
    if series["eta"] is not None:
        staleness.axhline(series["eta"], color="black", ls=":", lw=1, label=f"η = {series['eta']} (bound)")
        top = max(top, series["eta"])
    staleness.set_ylim(-0.15, top + 0.6)  # the bound below the top edge, where the legend sits
    staleness.yaxis.set_major_locator(MaxNLocator(integer=True))
    staleness.set_ylabel("staleness (steps)")
    staleness.set_title("staleness of the trained batch", fontsize=9)
    staleness.legend(fontsize=7, ncol=3, loc="upper left")
    for ax in axes[1]:
        ax.set_xlabel("trainer step")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    fig.suptitle(title or "training curves")
    return fig


def training_curves(steps: Sequence[Mapping[str, Any]], path: str | Path, title: str = "", *,
                    summary: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Draw a training run's curves (`training_figure`) into `path`; returns what it drew."""
    series = training_series(steps, summary)
    _save(training_figure(series, title), path)
    return series


def run_plots(run_dir: str | Path, out_dir: str | Path | None = None) -> list[Path]:
    """`staleness_hist.png` and `utilisation.png` of one run directory, simulated or training, from
    its `summary.json`, `metrics.jsonl` and (a training run) `trace.jsonl`, and for a training run
    `training_curves.png` (`is_training_run`), into `out_dir` (default: the run directory).
    ValueError (one line) when the directory holds no run."""
    run_dir = Path(run_dir)
    missing = [name for name in (SUMMARY_FILE, METRICS_FILE) if not (run_dir / name).is_file()]
    if missing:
        raise ValueError(f"{run_dir}: no run here (no {' or '.join(missing)}; planner.simulate and "
                         "jaxrl_async.train write them)")
    out = Path(out_dir) if out_dir is not None else run_dir
    out.mkdir(parents=True, exist_ok=True)
    summary = json.loads((run_dir / SUMMARY_FILE).read_text(encoding="utf-8"))
    steps = read_steps(run_dir / METRICS_FILE)
    trace = run_dir / TRACE_FILE
    title = f"{summary['policy']}, η={summary['max_staleness']}"
    paths = [out / "staleness_hist.png", out / "utilisation.png"]
    staleness_histogram(summary, paths[0])
    utilisation(steps, paths[1], title=title, active=trace_active(trace) if trace.is_file() else None)
    if is_training_run(steps):
        paths.append(out / "training_curves.png")
        training_curves(steps, paths[2], title=title, summary=summary)
    return paths


def eta_series(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """What `throughput_vs_eta` draws, from workload-filtered compare rows (policy, eta,
    steps_per_hour, unbounded_ceiling, no_drop_bound, groups_dropped): per policy its
    (η, steps/h, groups dropped) points by η; the no-drop bound by η, capped at the ceiling
    (results.csv keeps the bound itself: above the ceiling it binds nothing); the ceiling."""
    ceiling = rows[0]["unbounded_ceiling"]
    bound = {r["eta"]: r["no_drop_bound"] for r in rows}
    return {
        "policies": {p: sorted((r["eta"], r["steps_per_hour"], r["groups_dropped"]) for r in rows if r["policy"] == p)
                     for p in sorted({r["policy"] for r in rows})},
        "bound": [(e, min(bound[e], ceiling)) for e in sorted(bound)],
        "ceiling": ceiling,
    }


def throughput_vs_eta(rows: Sequence[Mapping[str, Any]], path: str | Path, title: str = "") -> None:
    """Steps/h against η per policy (`eta_series`), the no-drop bound and the unbounded ceiling. A
    run that dropped groups is a hollow marker labelled with its drop count: its steps/h is not a
    no-drop figure."""
    series = eta_series(rows)
    fig, ax = plt.subplots(figsize=(6, 4))
    any_drops = False
    for policy, points in series["policies"].items():
        (line,) = ax.plot([e for e, _, _ in points], [v for _, v, _ in points], marker="o", label=policy)
        for eta, value, dropped in points:
            if dropped:
                any_drops = True
                ax.plot(eta, value, "o", mfc="white", mec=line.get_color(), ms=8)
                ax.annotate(f"{dropped} dropped", (eta, value), fontsize=6, xytext=(4, 4), textcoords="offset points",
                            color=line.get_color())
    ax.plot([e for e, _ in series["bound"]], [b for _, b in series["bound"]], "k:",
            label="no-drop upper bound (≤ ceiling)")
    ax.axhline(series["ceiling"], color="gray", ls="--", label="unbounded (async ceiling)")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("η (max staleness)")
    ax.set_ylabel("steps per hour")
    ax.set_title(title + (" (hollow: groups dropped)" if any_drops else ""))
    ax.legend(fontsize=7)
    _save(fig, path)


def staleness_histograms(summaries: Mapping[str, Mapping[str, Any]], path: str | Path, title: str = "") -> None:
    """One panel per label (e.g. policy), bars per staleness; a panel's title counts its drops."""
    labels = list(summaries)
    fig, axes = plt.subplots(1, len(labels), figsize=(2.6 * len(labels) + 1, 3), squeeze=False, sharey=True)
    for ax, label in zip(axes[0], labels):
        hist = {int(k): v for k, v in summaries[label]["staleness_histogram"].items()}
        total = sum(hist.values()) or 1
        ax.bar(list(hist), [v / total for v in hist.values()])
        dropped = summaries[label].get("groups_dropped", 0)
        ax.set_title(label + (f"\n{dropped} groups dropped" if dropped else ""), fontsize=8)
        ax.set_xlabel("staleness")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    axes[0][0].set_ylabel("fraction of trained tokens")
    fig.suptitle(title)
    _save(fig, path)


def schedule_gantt(ledger_path: str | Path, path: str | Path, *, start: int, steps: int) -> dict[int, dict[str, Any]]:
    """The planner's schedule from the ledger, for the groups first admitted at versions
    [start, start + steps) (rows, admission order): each group's window [admission version,
    deadline] as a bar, each planned step it was moved to as a dot, reassignments as arrows, the
    step that trained it as a cross, a drop as a red triangle at the step it happened. Returns the
    rows drawn: uid -> admission version `a`, deadline `d`, `moves`, `trained` and `dropped` steps."""
    rows: dict[int, dict[str, Any]] = {}
    for ev in read_ledger(ledger_path):
        kind, uid = ev["event"], ev.get("uid")
        if kind == "admit" and uid not in rows and start <= ev["version"] < start + steps:
            rows[uid] = {"a": ev["version"], "d": ev["deadline"], "moves": [], "trained": None, "dropped": None}
        elif kind == "move" and uid in rows:
            rows[uid]["moves"].append((ev["from"], ev["to"]))
        elif kind == "drop" and uid in rows:
            rows[uid]["dropped"] = ev["step"]
        elif kind == "train":
            for g in ev["groups"]:
                if g["uid"] in rows:
                    rows[g["uid"]]["trained"] = ev["step"]
    fig, ax = plt.subplots(figsize=(8, min(40, max(3, 0.1 * len(rows) + 1))))
    for y, (uid, r) in enumerate(rows.items()):
        if r["d"] is not None:
            ax.barh(y, r["d"] - r["a"] + 1, left=r["a"] - 0.5, height=0.6, color="tab:blue", alpha=0.25)
        for src, dst in r["moves"]:
            if src >= 0:
                ax.annotate("", (dst, y), (src, y), arrowprops={"arrowstyle": "->", "color": "tab:orange", "lw": 0.8})
            ax.plot(dst, y, ".", color="tab:orange", ms=4)
        if r["trained"] is not None:
            ax.plot(r["trained"], y, "x", color="tab:green", ms=5)
        if r["dropped"] is not None:
            ax.plot(r["dropped"], y, "v", color="tab:red", ms=5)
    ax.set_yticks(range(len(rows)), [str(u) for u in rows], fontsize=max(2, min(6, 400 // max(1, len(rows)))))
    ax.invert_yaxis()
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("trainer step")
    ax.set_ylabel("group uid (admission order)")
    dropped = sum(r["dropped"] is not None for r in rows.values())
    ax.set_title(f"schedule, groups admitted at versions {start}–{start + steps - 1}: window (bar), planned step "
                 f"moves (→), trained (x)" + (f", dropped (▼, {dropped})" if dropped else ""), fontsize=9)
    _save(fig, path)
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m planner.plots", description="Draw a run directory's plots "
                                 "(staleness histogram, trainer and generator utilisation; for a training run also "
                                 "reward, loss, held-out pass@1 and staleness per step).")
    ap.add_argument("run_dir", help="a run's directory (planner.simulate or jaxrl_async.train)")
    ap.add_argument("--out", help="where to write the PNGs (default RUN_DIR)")
    args = ap.parse_args(argv)
    try:
        paths = run_plots(args.run_dir, args.out)
    except (ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    for p in paths:
        print(f"wrote {p}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
