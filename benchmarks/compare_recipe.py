"""Policies and losses side by side on one real-model recipe (README "Train a real model").

    python benchmarks/compare_recipe.py [--experiment smollm2_products12] [--root RUNS] [--out benchmarks/results]
    python benchmarks/compare_recipe.py --only lookahead-grpo-eta2,areal-grpo-eta2   # a subset
    python benchmarks/compare_recipe.py --experiment smollm2_calculator \
        --only lookahead-grpo-eta1,nemo_in_order-grpo-eta1,lookahead-grpo-eta2,nemo_in_order-grpo-eta2

Each variant is one `python -m jaxrl_async.train +experiment=E policy=P trainer=L max_staleness=η`
run, one after the other (the machine's cores go to one run at a time, so wall times compare);
a variant whose run directory already holds a `summary.json` is not run again, so an interrupted
sweep continues where it stopped. For each run the script scores the final export (`RUN_DIR/hf`)
on the held-out split (greedy pass@1, `jaxrl_async.eval`), reads the in-training evaluations and
the rewards from `metrics.jsonl`, the token staleness histogram, the drops and the audit verdict,
and writes `<experiment>_compare.md` (the table) and `<experiment>_compare.png` (held-out pass@1
and training reward against wall time) to `--out`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from plot_recipe import held_out_pass_at_1, smooth  # noqa: E402  benchmarks/, beside this script


@dataclass(frozen=True)
class Variant:
    policy: str
    loss: str
    eta: int

    @property
    def name(self) -> str:
        return f"{self.policy}-{self.loss}-eta{self.eta}"

    @classmethod
    def parse(cls, name: str) -> Variant:
        """`POLICY-LOSS-etaN` (the form `name` writes), any policy and loss preset the trainer knows."""
        policy, loss, eta = name.rsplit("-", 2)
        if not eta.startswith("eta") or not eta[3:].isdigit():
            raise ValueError(f"{name!r}: a variant is POLICY-LOSS-etaN, e.g. lookahead-grpo-eta2")
        return cls(policy, loss, int(eta[3:]))

    def overrides(self) -> list[str]:
        return [f"policy={self.policy}", f"trainer={self.loss}", f"max_staleness={self.eta}"]


# The policy comparison at η=2 (one strict peer that waits, one non-strict), then the losses
# built for stale data (CISPO, M2PO) against GRPO at η=2 and η=4, all under lookahead.
VARIANTS = (
    Variant("lookahead", "grpo", 2), Variant("nemo_in_order", "grpo", 2), Variant("areal", "grpo", 2),
    Variant("lookahead", "cispo", 2), Variant("lookahead", "m2po", 2),
    Variant("lookahead", "grpo", 4), Variant("lookahead", "cispo", 4), Variant("lookahead", "m2po", 4),
)


def run(variant: Variant, experiment: str, run_dir: Path, seed: int) -> None:
    if (run_dir / "summary.json").exists():
        print(f"{variant.name}: {run_dir} already ran", flush=True)
        return
    cmd = [sys.executable, "-m", "jaxrl_async.train", f"+experiment={experiment}", *variant.overrides(),
           f"seed={seed}", "progress=plain", f"hydra.run.dir={run_dir}"]
    print(" ".join(cmd), flush=True)
    t0 = time.monotonic()
    with open(run_dir.with_suffix(".log"), "w") as log:
        subprocess.run(cmd, check=True, stdout=log, stderr=subprocess.STDOUT)
    print(f"{variant.name}: {time.monotonic() - t0:.0f} s", flush=True)


def end_of_run_drops(run_dir: Path) -> int:
    """The ledger's drops with reason `end_of_run`: groups still sampling when the last step ended,
    which every policy leaves (a strict policy's staleness drops are the rest)."""
    lines = (json.loads(line) for line in (run_dir / "ledger.jsonl").read_text().splitlines() if line.strip())
    return sum(1 for e in lines if e.get("event") == "drop" and e.get("reason") == "end_of_run")


def read(variant: Variant, run_dir: Path) -> dict:
    from omegaconf import OmegaConf

    run = OmegaConf.to_container(OmegaConf.load(run_dir / ".hydra" / "config.yaml"), resolve=True)
    summary = json.loads((run_dir / "summary.json").read_text())
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    hist: dict[int, int] = {}
    for r in records:
        for age, tokens in r["staleness_hist"].items():
            hist[int(age)] = hist.get(int(age), 0) + tokens
    tokens = sum(hist.values())
    evals = [(r["elapsed_s"], r["eval/pass_at_1"]) for r in records if "eval/pass_at_1" in r]
    final = held_out_pass_at_1(str(run_dir / "hf"), run)
    return dict(variant=variant, run=run, summary=summary, final=final, evals=evals + [(summary["elapsed_s"], final)],
                rewards=[(r["elapsed_s"], r["reward_mean"]) for r in records],
                last_reward=sum(r["reward_mean"] for r in records[-10:]) / len(records[-10:]),
                mean_staleness=sum(a * t for a, t in hist.items()) / tokens, max_staleness=max(hist),
                # How far the trained policy had moved from the one that sampled: the largest
                # importance weight π_θ/π_behaviour of each step (what CISPO caps and M2PO masks).
                is_weight_max=[r["train/is_weight_max"] for r in records], end_of_run=end_of_run_drops(run_dir))


def report(rows: list[dict], experiment: str, base: float, out: Path) -> str:
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(7, 7), sharex=True)
    for row in rows:
        label = row["variant"].name
        top.plot(*zip(*([(0.0, base)] + row["evals"])), marker="o", label=label)
        times, rewards = zip(*row["rewards"])
        bottom.plot(times, smooth(list(rewards)), label=label)
    top.set(ylabel="held-out greedy pass@1", title=f"SmolLM2-135M, +experiment={experiment}")
    bottom.set(xlabel="wall time (s)", ylabel="training reward (5-step mean)")
    top.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / f"{experiment}_compare.png", dpi=120)

    lines = ["| policy | loss | η | held-out pass@1 (before → after) | reward, last 10 steps | wall time (s) "
             "| steps/h | max staleness | mean staleness | largest IS weight (median / max of steps) | drops (at the run's end) | audit |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        v, s = row["variant"], row["summary"]
        lines.append(f"| {v.policy} | {v.loss} | {v.eta} | {base:.3f} → {row['final']:.3f} | {row['last_reward']:.3f} "
                     f"| {s['elapsed_s']:.0f} | {3600 * s['steps'] / s['elapsed_s']:.0f} | {row['max_staleness']} "
                     f"| {row['mean_staleness']:.2f} | {statistics.median(row['is_weight_max']):.3f} / "
                     f"{max(row['is_weight_max']):.3f} | {s['groups_dropped']} ({row['end_of_run']}) | {'PASS' if s.get('audit_ok') else 'FAIL'} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--experiment", default="smollm2_products12")
    parser.add_argument("--root", type=Path, default=Path("runs/compare"))
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--only", default="", help="comma-separated variants POLICY-LOSS-etaN, in this order "
                                                   "(default: VARIANTS)")
    args = parser.parse_args()
    try:
        chosen = [Variant.parse(name) for name in args.only.split(",")] if args.only else list(VARIANTS)
    except ValueError as e:
        parser.error(f"--only: {e}")
    args.root.mkdir(parents=True, exist_ok=True)
    args.out.mkdir(parents=True, exist_ok=True)
    for variant in chosen:
        run(variant, args.experiment, args.root / variant.name, args.seed)
    rows = [read(v, args.root / v.name) for v in chosen]
    base = held_out_pass_at_1(rows[0]["run"]["model"]["source"], rows[0]["run"])
    table = report(rows, args.experiment, base, args.out)
    (args.out / f"{args.experiment}_compare.md").write_text(
        f"# Policies and losses on `+experiment={args.experiment}` (seed {args.seed}, CPU, 2 cores)\n\n"
        "Held-out pass@1: greedy, the run's final export scored by `jaxrl_async.eval`. Staleness: over "
        "trained tokens. Drops and audit: the run's summary.json (`python -m planner.audit`); in "
        "parentheses the drops of groups still sampling at the run's end (ledger reason `end_of_run`).\n\n"
        + table + f"\n\n![curves]({args.experiment}_compare.png)\n")
    print(table)


if __name__ == "__main__":
    main()
