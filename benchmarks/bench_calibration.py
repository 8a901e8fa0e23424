"""Does a calibrated simulation predict its real run? (docs/calibration.md)

For each policy × real CPU configuration: a real run (`python -m jaxrl_async.train`, the default
tiny model), `planner.calibrate` on its trace, a replay (`planner.simulate calibration=...
workload=trace workload.path=RUN_DIR/trace.jsonl`, same policy, η, B, n, steps), and
`planner.fidelity.compare` of the two over the steady state (the first WARMUP steps compile).
Targets: steps/hour within 15%, busy fractions within 0.1, staleness histograms within 0.1 TV.
The real runs go one at a time (the machine is shared).

    python benchmarks/bench_calibration.py [--steps 40] [--out benchmarks/results/calibration.md]
    python benchmarks/bench_calibration.py --cross [--steps 40]

`--cross` checks that a calibration carries over to another configuration (issue 20, target
within 15%): the calibration of a real `CROSS_FROM` run predicts a real `CROSS_TO` run's steady
steps/h, replaying the second run's groups with its own policy, η, B, n and engine slots
(`sim.workers.max_concurrency` from its trace's `run` line) on the first run's cost model.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from planner.tools.calibrate import CALIBRATION_FILE, calibrate  # noqa: E402
from planner.fidelity import compare  # noqa: E402

POLICIES = ("lookahead", "nemo_in_order", "areal")
CONFIGS = {
    "default": [],
    "slot_limited": ["engine.num_slots=16"],  # 16 slots < B·n = 64 samples
    # Generation is the bottleneck: 48-token completions decoded one token per engine call in 16
    # slots, at η=2, so groups are still generating when the trainer asks and the staleness
    # histogram depends on the timing the simulator has to predict.
    "generation_bound": ["engine.num_slots=16", "max_new_tokens=48", "engine.decode_steps_per_call=1",
                         "max_staleness=2"],
}
RUN = ["progress=off", "tensorboard=false", "export_hf=false"]
CROSS_FROM = ("lookahead", ["max_staleness=1"])
CROSS_TO = ("nemo_in_order", ["max_staleness=2", "engine.num_slots=32"])
WARMUP = 3


def python(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, *args], cwd=REPO, env=env, capture_output=True, text=True, check=True)


def one(policy: str, config: str, steps: int, root: Path) -> dict:
    real, sim = root / f"{policy}-{config}-real", root / f"{policy}-{config}-sim"
    t0 = time.monotonic()
    python("-m", "jaxrl_async.train", f"policy={policy}", f"steps={steps}", *RUN, *CONFIGS[config],
           f"hydra.run.dir={real}")
    wall = time.monotonic() - t0
    cal = calibrate(real)
    import yaml

    (real / CALIBRATION_FILE).write_text(yaml.safe_dump(cal, sort_keys=False))
    r = cal["run"]
    python("-m", "planner.simulate", f"calibration={real / CALIBRATION_FILE}", "workload=trace",
           f"workload.path={real / 'trace.jsonl'}", f"policy={policy}", f"max_staleness={r['max_staleness']}",
           f"batch_groups={r['batch_groups']}", f"group_size={r['group_size']}", f"steps={steps}",
           f"hydra.run.dir={sim}")
    out = compare(real, sim, WARMUP)
    out.update(policy=policy, config=config, wall_s=wall, calibration=cal)
    return out


def cross(steps: int, root: Path) -> dict:
    """CROSS_FROM's calibration predicting CROSS_TO's real run (module docstring)."""
    import yaml

    runs = {}
    for name, (policy, extra) in (("from", CROSS_FROM), ("to", CROSS_TO)):
        runs[name] = root / f"cross-{name}-{policy}"
        python("-m", "jaxrl_async.train", f"policy={policy}", f"steps={steps}", *RUN, *extra,
               f"hydra.run.dir={runs[name]}")
    cal = calibrate(runs["from"])
    (runs["from"] / CALIBRATION_FILE).write_text(yaml.safe_dump(cal, sort_keys=False))
    target = calibrate(runs["to"])["run"]  # its planner context and slots, not its cost model
    sim = root / "cross-sim"
    python("-m", "planner.simulate", f"calibration={runs['from'] / CALIBRATION_FILE}", "workload=trace",
           f"workload.path={runs['to'] / 'trace.jsonl'}", f"policy={target['policy']}",
           f"max_staleness={target['max_staleness']}", f"batch_groups={target['batch_groups']}",
           f"group_size={target['group_size']}", f"steps={steps}", f"sim.workers.max_concurrency={target['slots']}",
           f"hydra.run.dir={sim}")
    out = compare(runs["to"], sim, WARMUP)
    real_steady = json.loads((runs["to"] / "summary.json").read_text())["steps_per_hour_steady"]
    sim_steady = json.loads((sim / "summary.json").read_text())["steps_per_hour_steady"]
    out.update(real_steady=real_steady, sim_steady=sim_steady, steady_error=sim_steady / real_steady - 1)
    return out


def ok(value: float, bound: float) -> str:
    return f"{value:+.3f}" + ("" if abs(value) <= bound else " ✗")


def table(rows: list[dict], steps: int) -> str:
    head = ("| policy | config | real steps/h | sim steps/h | error | trainer busy real (step / runtime) | sim | "
            "error | generator busy real | sim | error | staleness TV |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for o in rows:
        r, s = o["real"], o["sim"]
        lines.append(
            f"| {o['policy']} | {o['config']} | {r['steps_per_hour']:.0f} | {s['steps_per_hour']:.0f} | "
            f"{ok(o['steps_per_hour_error'], 0.15)} | {r['trainer_step_busy']:.3f} / {r['trainer_busy']:.3f} | "
            f"{s['trainer_busy']:.3f} | {ok(o['trainer_busy_error'], 0.1)} | {r['generator_busy']:.3f} | "
            f"{s['generator_busy']:.3f} | {ok(o['generator_busy_error'], 0.1)} | {ok(o['staleness_tv'], 0.1)} |")
    cal = ["| policy | config | α s/step | β s/token | prefill s/token | c0 s | c1 s/token | load_lag s | "
           "decode RMS s / R² | trainer RMS s / R² |", "|---|---|---|---|---|---|---|---|---|---|"]
    for o in rows:
        w, t, f = o["calibration"]["sim"]["workers"], o["calibration"]["sim"]["trainer"], o["calibration"]["fit"]
        cal.append(f"| {o['policy']} | {o['config']} | {w['decode_alpha']:.3g} | {w['decode_beta']:.3g} | "
                   f"{w['prefill_per_token']:.3g} | {t['c0']:.3g} | {t['c1']:.3g} | {w['load_lag']:.3g} | "
                   f"{f['decode']['rms_s']} / {f['decode']['r2']} | {f['trainer']['rms_s']} / {f['trainer']['r2']} |")
    return "\n".join(lines) + "\n\nFitted cost models:\n\n" + "\n".join(cal) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--out", default=str(REPO / "benchmarks/results/calibration_table.md"))
    ap.add_argument("--json", default=None, help="also write the raw comparisons here")
    ap.add_argument("--configs", default=",".join(CONFIGS), help=f"comma-separated, of {', '.join(CONFIGS)}")
    ap.add_argument("--policies", default=",".join(POLICIES))
    ap.add_argument("--cross", action="store_true", help="only the cross-configuration check")
    args = ap.parse_args()
    if args.cross:
        with tempfile.TemporaryDirectory() as tmp:
            o = cross(args.steps, Path(tmp))
        print(f"{CROSS_FROM[0]} {' '.join(CROSS_FROM[1])} calibration -> {CROSS_TO[0]} {' '.join(CROSS_TO[1])}: "
              f"steady steps/h real {o['real_steady']:.0f}, predicted {o['sim_steady']:.0f} "
              f"({o['steady_error']:+.1%}); fidelity steps/h error {o['steps_per_hour_error']:+.3f}, "
              f"staleness TV {o['staleness_tv']:.3f}")
        return
    configs, policies = args.configs.split(","), args.policies.split(",")
    unknown = sorted(set(configs) - set(CONFIGS))
    if unknown:
        ap.error(f"--configs: unknown {', '.join(unknown)} (known: {', '.join(CONFIGS)})")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for config in configs:
            for policy in policies:
                rows.append(one(policy, config, args.steps, Path(tmp)))
                print(f"{policy} {config}: steps/h error {rows[-1]['steps_per_hour_error']:+.3f}", flush=True)
    Path(args.out).write_text(table(rows, args.steps))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1, default=str))
    print(table(rows, args.steps))


if __name__ == "__main__":
    main()
