"""Does the tuner's recommendation perform on a real run as predicted? (docs/tuning.md)

1. A real run of the base configuration (`python -m jaxrl_async.train`, the default tiny model,
   η = `--eta`, greedy admission), calibrated by `planner.calibrate` on its own trace.
2. `python -m planner.tune target=min_staleness` over that calibration, replaying the run's trace
   as the workload: the recommended configuration with its predicted steps/hour and staleness.
3. A real run of the recommendation; both real runs measured over the same steady state
   (`planner.fidelity.figures`), next to the predictions.

    python benchmarks/bench_tune_verify.py [--steps 60] [--eta 2] [--out benchmarks/results/tune_verify.md]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from planner.ledger_audit import audit  # noqa: E402
from planner.tools.calibrate import CALIBRATION_FILE, calibrate  # noqa: E402
from planner.fidelity import figures  # noqa: E402
from planner.run_trace import TRACE_FILE  # noqa: E402

RUN = ["progress=off", "tensorboard=false", "export_hf=false"]
WARMUP = 3


def python(*args: str) -> str:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, *args], cwd=REPO, env=env, capture_output=True, text=True,
                          check=True).stdout


def real_run(run_dir: Path, steps: int, overrides: list[str]) -> dict:
    python("-m", "jaxrl_async.train", f"steps={steps}", *RUN, *overrides, f"hydra.run.dir={run_dir}")
    f = figures(run_dir, WARMUP)
    summary = json.loads((run_dir / "summary.json").read_text())
    tokens = sum(f.staleness.values())
    return {"steps_per_hour": f.steps_per_hour, "mean_staleness": sum(a * p for a, p in f.staleness.items()) / tokens,
            "audit": audit(run_dir).ok, "max_staleness": summary["max_token_staleness"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--eta", type=int, default=2)
    ap.add_argument("--budget", type=int, default=40)
    ap.add_argument("--out", default=str(REPO / "benchmarks/results/tune_verify.md"))
    args = ap.parse_args()
    import yaml

    with tempfile.TemporaryDirectory() as tmp:
        base_dir = Path(tmp) / "base"
        base = real_run(base_dir, args.steps, [f"max_staleness={args.eta}"])
        cal = calibrate(base_dir)
        (base_dir / CALIBRATION_FILE).write_text(yaml.safe_dump(cal, sort_keys=False))
        r = cal["run"]
        report = json.loads(python(
            "-m", "planner.tune", "target=min_staleness", f"eta={args.eta}", f"max_staleness={args.eta}",
            f"calibration={base_dir / CALIBRATION_FILE}", "workload=trace", f"workload.path={base_dir / TRACE_FILE}",
            f"batch_groups={r['batch_groups']}", f"group_size={r['group_size']}", f"steps={args.steps}",
            f"budget={args.budget}", "output=json"))
        best, predicted_base = report["recommended"], report["base"]
        overrides = best["train_overrides"]
        tuned = real_run(Path(tmp) / "tuned", args.steps, overrides)

    rows = [("base (greedy quota)", [f"max_staleness={args.eta}"], predicted_base, base),
            ("recommended", overrides, best, tuned)]
    lines = [f"# planner.tune verified on real CPU runs (`python benchmarks/bench_tune_verify.py --steps {args.steps} "
             f"--eta {args.eta}`)", "",
             "Default tiny model, B=8, n=8; the cost model is `planner.calibrate` on the base run's trace; "
             f"`planner.tune target=min_staleness eta={args.eta}` replays that trace ({report['runs']} simulated runs). "
             f"Real figures over steps {WARMUP - 1}–{args.steps - 1} (the first steps compile).", "",
             "| config | overrides | predicted steps/h | measured steps/h | error | predicted mean staleness "
             "| measured | max staleness | audit |", "|---|---|---|---|---|---|---|---|---|"]
    for name, ov, pred, real in rows:
        lines.append(f"| {name} | `{' '.join(ov)}` | {pred['steps_per_hour']:.0f} | {real['steps_per_hour']:.0f} | "
                     f"{pred['steps_per_hour'] / real['steps_per_hour'] - 1:+.3f} | {pred['mean_token_staleness']:.2f} | "
                     f"{real['mean_staleness']:.2f} | {real['max_staleness']} | {'PASS' if real['audit'] else 'FAIL'} |")
    text = "\n".join(lines) + "\n"
    Path(args.out).write_text(text)
    print(text)


if __name__ == "__main__":
    main()
