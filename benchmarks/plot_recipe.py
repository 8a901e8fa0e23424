"""Curves and before/after table of a SmolLM2 recipe (README "Train a real model", "Environments").

    python benchmarks/plot_recipe.py RUN_DIR [RUN_DIR ...] [--name smollm2_arithmetic] [--out benchmarks/results]

Each RUN_DIR is a finished `python -m jaxrl_async.train +experiment=NAME seed=S` run (one recipe,
any seeds). The script scores the base model and each run's final export (`RUN_DIR/hf`) on the
held-out split with `jaxrl_async.eval` (greedy pass@1, the run's max_new_tokens and engine.max_len,
so a multi-turn task plays the same episodes), reads the in-training evaluations
(`eval/pass_at_1` in metrics.jsonl) and the training reward, and writes `NAME_reward.png`,
`NAME_eval.png` and `NAME.md` (a Markdown table) to `--out`.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from jaxrl_async.cli.eval import EvalConfig, evaluate  # noqa: E402
from jaxrl_async.models.config import ModelSpec  # noqa: E402


def held_out_pass_at_1(source: str, run: dict) -> float:
    config = EvalConfig(model=ModelSpec(source=source), task=dict(run["task"]), max_new_tokens=run["max_new_tokens"],
                        max_len=run["engine"].get("max_len"))
    return evaluate(config)[0].greedy_pass_at_1


def smooth(values: list[float], k: int = 5) -> list[float]:
    return [sum(values[max(0, i - k + 1): i + 1]) / len(values[max(0, i - k + 1): i + 1]) for i in range(len(values))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    parser.add_argument("--name", default="smollm2_arithmetic", help="the recipe: names the files written")
    parser.add_argument("--title", default="SmolLM2-135M, one-digit products")
    args = parser.parse_args()
    from omegaconf import OmegaConf

    rows, curves = [], []
    base = None
    for run_dir in args.runs:
        run = OmegaConf.to_container(OmegaConf.load(run_dir / ".hydra" / "config.yaml"), resolve=True)
        summary = json.loads((run_dir / "summary.json").read_text())
        records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
        if base is None:
            base = held_out_pass_at_1(run["model"]["source"], run)
        final = held_out_pass_at_1(str(run_dir / "hf"), run)
        evals = [(r["eval/version"], r["eval/pass_at_1"]) for r in records if "eval/pass_at_1" in r]
        # The base model: the run's own first evaluation (eval/version 0), else the CLI's figure.
        if not evals or evals[0][0] != 0:
            evals.insert(0, (0, base))
        evals.append((summary["steps"], final))
        curves.append((run["seed"], [r["reward_mean"] for r in records], evals))
        rows.append((run["seed"], base, final, summary["elapsed_s"], summary["max_token_staleness"],
                     summary["groups_dropped"], summary["audit_ok"]))

    args.out.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(6, 3.5))
    for seed, rewards, _ in curves:
        ax.plot(smooth(rewards), label=f"seed {seed}")
    ax.set(xlabel="step", ylabel="training reward (5-step mean)", title=args.title)
    ax.legend()
    fig.tight_layout()
    fig.savefig(args.out / f"{args.name}_reward.png", dpi=120)
    fig, ax = plt.subplots(figsize=(6, 3.5))
    for seed, _, evals in curves:
        ax.plot(*zip(*evals), marker="o", label=f"seed {seed}")
    ax.set(xlabel="step (weights version)", ylabel="held-out greedy pass@1", ylim=(0, 1),
           title="held-out pairs, scored on the engine during training")
    ax.legend()
    fig.tight_layout()
    fig.savefig(args.out / f"{args.name}_eval.png", dpi=120)

    lines = ["| seed | held-out pass@1 before | after | run time (s) | max staleness | drops | audit |",
             "|---|---|---|---|---|---|---|"]
    lines += [f"| {s} | {b:.3f} | {a:.3f} | {t:.0f} | {m} | {d} | {'PASS' if ok else 'FAIL'} |"
              for s, b, a, t, m, d, ok in rows]
    table = "\n".join(lines)
    (args.out / f"{args.name}.md").write_text(
        f"# {args.title} (`+experiment={args.name}`)\n\n"
        "Held-out: the task's held-out split, never trained on, greedy, scored by the task; CPU, 2 cores.\n\n"
        + table + f"\n\n![reward]({args.name}_reward.png)\n![eval]({args.name}_eval.png)\n")
    print(table)


if __name__ == "__main__":
    main()
