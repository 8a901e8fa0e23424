"""Real CPU runs of `python -m jaxrl_async.train`, one per policy, same seed and budget, side by side.

    python benchmarks/bench_runtime_policies.py [--steps 40] [--policies lookahead,nemo_in_order,...]
        [-- extra hydra overrides, e.g. engine.num_slots=32]

Each policy runs in a fresh process (no compilation cache shared between runs) on the default
embedded setup (tiny model, repeat_letter, η=1). Reported, from each run's own files:

- steps/hour and trainer idle fraction in the steady state: from the end of step 0 (which carries
  the one-off compilations) to the end of the run, from `metrics.jsonl` (idle = time the trainer
  waited for a batch / that span);
- drops and wasted tokens (generated, then dropped) and the max token staleness, from the ledger
  audit (`planner.audit`);
- the final reward (mean of the last 5 steps), to show the policies trained the same task.

With `--repeats R` the policies run in R interleaved rounds (every policy once per round, so
machine noise hits all alike) and the table quotes medians. Ratios are against `lookahead`
(first column of numbers / lookahead's). A markdown table is written
to `--out` (default benchmarks/results/runtime_policies.md).
"""

from __future__ import annotations

import argparse
import json
import statistics
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
POLICIES = ("lookahead", "nemo_in_order", "nemo_weight_fifo", "nemo_windowed", "areal")


def run_policy(policy: str, steps: int, seed: int, extra: list[str], workdir: Path) -> dict:
    run_dir = workdir / policy
    cmd = [sys.executable, "-m", "jaxrl_async.train", f"policy={policy}", f"steps={steps}", f"seed={seed}",
           "progress=off", "tensorboard=false", "export_hf=false", f"hydra.run.dir={run_dir}", *extra]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True,
                          env={**os.environ, "JAX_PLATFORMS": os.environ.get("JAX_PLATFORMS", "cpu")})
    if not (run_dir / "summary.json").exists():
        raise RuntimeError(f"{policy}: run failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    summary = json.loads((run_dir / "summary.json").read_text())
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    steady = metrics[1:]
    span = metrics[-1]["elapsed_s"] - metrics[0]["elapsed_s"]
    from planner.ledger_audit import audit

    report = audit(run_dir, summary["max_staleness"])
    return {
        "policy": policy,
        "steps_per_hour": 3600 * len(steady) / max(span, 1e-9),
        "trainer_idle": sum(m["wait_s"] for m in steady) / max(span, 1e-9),
        "drops": report.groups_dropped,
        "wasted_tokens": report.tokens_wasted,
        "max_staleness": report.max_token_staleness,
        "audit": "pass" if report.ok else "FAIL",
        "final_reward": sum(m["reward_mean"] for m in metrics[-5:]) / len(metrics[-5:]),
        "wall_s": summary["elapsed_s"],
    }


def ratio(value: float, base: float) -> str:
    if base == 0:
        return "–" if value == 0 else "∞"
    return f"{value / base:.2f}"


def table(rows: list[dict]) -> str:
    base = rows[0]
    head = ("| policy | steps/h | ×lookahead | trainer idle | ×lookahead | drops | wasted tokens | "
            "max staleness | audit | final reward |")
    lines = [head, "|" + "---|" * 10]
    for r in rows:
        lines.append(
            f"| {r['policy']} | {r['steps_per_hour']:.0f} | {ratio(r['steps_per_hour'], base['steps_per_hour'])} | "
            f"{r['trainer_idle']:.3f} | {ratio(r['trainer_idle'], base['trainer_idle'])} | {r['drops']} | "
            f"{r['wasted_tokens']} | {r['max_staleness']} | {r['audit']} | {r['final_reward']:.3f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    own = argv[:argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--policies", default=",".join(POLICIES))
    parser.add_argument("--repeats", type=int, default=1, help="interleaved rounds; the table quotes medians")
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "runtime_policies.md"))
    args = parser.parse_args(own)
    policies = args.policies.split(",")
    if policies[0] != "lookahead":
        parser.error("--policies: the first policy must be lookahead (the ratios' base)")
    runs: dict[str, list[dict]] = {p: [] for p in policies}
    for round_ in range(args.repeats):
        for policy in policies:
            with tempfile.TemporaryDirectory() as tmp:
                runs[policy].append(run_policy(policy, args.steps, args.seed, extra, Path(tmp)))
            print(f"round {round_}: {policy} done ({runs[policy][-1]['wall_s']:.0f}s)", file=sys.stderr, flush=True)
    rows = []
    for policy in policies:
        row = dict(runs[policy][0])
        for key in ("steps_per_hour", "trainer_idle", "final_reward"):
            row[key] = statistics.median(r[key] for r in runs[policy])
        row["audit"] = "pass" if all(r["audit"] == "pass" for r in runs[policy]) else "FAIL"
        rows.append(row)
    text = table(rows)
    print(text)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    setup = f"steps={args.steps} seed={args.seed} repeats={args.repeats} (medians) " + " ".join(extra)
    out.write_text(f"# Runtime policies, real CPU runs ({setup.strip()})\n\n{text}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
