"""LoRA against full fine-tuning on one recipe, side by side in one run (README "LoRA").

    python benchmarks/bench_lora.py [--full smollm2_arithmetic] [--lora smollm2_arithmetic_lora] \
        [--seed 0] [--out benchmarks/results] [-- OVERRIDE ...]

Runs `python -m jaxrl_async.train +experiment=FULL` and then `+experiment=LORA` (same seed, so the
same prompts in the same order; one after the other, never two at once: they would share the
cores and the memory they measure), each under `/usr/bin/time -v`, and reads for each:

- held-out greedy pass@1 at every `eval.every` (the runs' own `eval/pass_at_1` records) and the
  first step at which it reached its best;
- peak resident memory (`/usr/bin/time -v`'s "Maximum resident set size", bench_memory.py);
- the median train step (`train_s`, the first step left out: it compiles) and the run's wall time;
- what a weight push moves and takes (`summary.json`: `lora.push_bytes` or the full weights' bytes,
  `weight_push_s_mean`: trainer layout to every engine holding it).

Writes `<lora>.md` (the table, LoRA's figures as fractions of full fine-tuning's) and `<lora>.png`
(held-out pass@1 against step) to `--out`. A run directory that already holds a `summary.json`
is read, not run again.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from bench_memory import max_rss_gib, split_overrides  # noqa: E402  benchmarks/, beside this script


def run(experiment: str, run_dir: Path, seed: int, overrides: list[str]) -> None:
    if (run_dir / "summary.json").exists():
        print(f"{experiment}: {run_dir} already ran", flush=True)
        return
    cmd = ["/usr/bin/time", "-v", sys.executable, "-m", "jaxrl_async.train", f"+experiment={experiment}",
           f"seed={seed}", "progress=plain", f"hydra.run.dir={run_dir}", *overrides]
    print(" ".join(cmd), flush=True)
    t0 = time.monotonic()
    with open(run_dir.with_suffix(".log"), "w") as log:
        subprocess.run(cmd, check=True, stdout=log, stderr=subprocess.STDOUT)
    print(f"{experiment}: {time.monotonic() - t0:.0f} s", flush=True)


def read(run_dir: Path) -> dict:
    summary = json.loads((run_dir / "summary.json").read_text())
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    evals = [(r["eval/version"], r["eval/pass_at_1"]) for r in records if "eval/pass_at_1" in r]
    train_s = [r["train_s"] for r in records if "train_s" in r][1:]
    best = max(p for _, p in evals)
    lora = summary.get("lora")
    return {
        "evals": evals,
        "best": best,
        "best_at": min(v for v, p in evals if p == best),
        "final": evals[-1][1],
        "peak_rss_gib": max_rss_gib(run_dir.with_suffix(".log").read_text()),
        "step_s": statistics.median(train_s),
        "wall_s": summary["elapsed_s"],
        "push_bytes": lora["push_bytes"] if lora else None,
        "full_push_bytes": lora["full_push_bytes"] if lora else None,
        "push_s": summary["weight_push_s_mean"],
        "audit_ok": summary["audit_ok"],
        "max_staleness": summary["max_token_staleness"],
        "dropped": summary["groups_dropped"],
    }


def table(full_name: str, lora_name: str, full: dict, lora: dict) -> str:
    # The full run's push moves every weight: lora's `full_push_bytes` is that size (the same model).
    full_bytes = lora["full_push_bytes"]
    rows = [
        ("held-out pass@1: base -> final", f"{full['evals'][0][1]:.3f} -> {full['final']:.3f}",
         f"{lora['evals'][0][1]:.3f} -> {lora['final']:.3f}", ""),
        ("best held-out pass@1 (first step at it)", f"{full['best']:.3f} (step {full['best_at']})",
         f"{lora['best']:.3f} (step {lora['best_at']})", ""),
        ("peak resident GiB", f"{full['peak_rss_gib']:.2f}", f"{lora['peak_rss_gib']:.2f}",
         f"{lora['peak_rss_gib'] / full['peak_rss_gib']:.0%}"),
        ("train step s (median)", f"{full['step_s']:.2f}", f"{lora['step_s']:.2f}", f"{lora['step_s'] / full['step_s']:.0%}"),
        ("run wall s", f"{full['wall_s']:.0f}", f"{lora['wall_s']:.0f}", f"{lora['wall_s'] / full['wall_s']:.0%}"),
        ("bytes a weight push", f"{full_bytes / 1e6:.1f} MB", f"{lora['push_bytes'] / 1e6:.1f} MB",
         f"{lora['push_bytes'] / full_bytes:.1%}"),
        ("seconds a weight push (mean)", f"{full['push_s']:.3f}", f"{lora['push_s']:.3f}",
         f"{lora['push_s'] / full['push_s']:.1%}" if full["push_s"] else ""),
        ("audit / max staleness / drops", f"{'PASS' if full['audit_ok'] else 'FAIL'} / {full['max_staleness']} / {full['dropped']}",
         f"{'PASS' if lora['audit_ok'] else 'FAIL'} / {lora['max_staleness']} / {lora['dropped']}", ""),
    ]
    out = [f"| | full (`+experiment={full_name}`) | LoRA (`+experiment={lora_name}`) | LoRA / full |",
           "|---|---|---|---|"]
    out += [f"| {a} | {b} | {c} | {d} |" for a, b, c, d in rows]
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> None:
    argv, overrides = split_overrides(argv)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--full", default="smollm2_arithmetic")
    parser.add_argument("--lora", default="smollm2_arithmetic_lora")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--root", type=Path, default=Path("/tmp/bench_lora"))
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    args = parser.parse_args(argv)
    args.root.mkdir(parents=True, exist_ok=True)
    args.out.mkdir(parents=True, exist_ok=True)
    results = {}
    for name in (args.full, args.lora):
        run_dir = args.root / f"{name}-seed{args.seed}"
        run(name, run_dir, args.seed, overrides)
        results[name] = read(run_dir)
    text = table(args.full, args.lora, results[args.full], results[args.lora])
    (args.out / f"{args.lora}.md").write_text(
        f"# {args.lora} against {args.full}, seed {args.seed}, one after the other on this machine\n\n"
        f"`python benchmarks/bench_lora.py {' '.join(sys.argv[1:])}`\n\n" + text)
    print(text)
    fig, ax = plt.subplots(figsize=(6, 3.5))
    for name, label in ((args.full, "full fine-tuning"), (args.lora, "LoRA")):
        steps, scores = zip(*results[name]["evals"])
        ax.plot(steps, scores, marker="o", label=label)
    ax.set_xlabel("step")
    ax.set_ylabel("held-out greedy pass@1")
    ax.set_ylim(0, 1.05)
    ax.legend()
    fig.tight_layout()
    fig.savefig(args.out / f"{args.lora}.png", dpi=120)


if __name__ == "__main__":
    main()
