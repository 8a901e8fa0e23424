"""Real CPU runs with two JAX engine replicas on a tail-heavy workload: lookahead with and without
tail scheduling, side by side.

    python benchmarks/bench_tail_runtime.py [--steps 30] [--repeats 3] [--configs plain,migrate,migrate_spec]
        [-- extra hydra overrides]

Every run is `python -m jaxrl_async.train` in a fresh process on the embedded setup (tiny model,
repeat_letter, lookahead, η=1) with `engine.replicas=2 engine.colocate=false` (3 host devices:
the trainer's and one per replica) and `task.lengths=heavy_tail` (each prompt its own
max_new_tokens from the simulator's heavy-tail distribution, stop tokens ignored,
jaxrl_async/tasks/lengths.py), so a step waits for its longest group. The configurations:

- `plain`: lookahead alone;
- `migrate`: `policy.migrate=true` — the groups the waiting trainer needs move to the less loaded
  replica (engines/replicated.py);
- `migrate_spec`: also `engine.speculation.when=critical` (n-gram drafts for those groups).

`--warmup` rounds run first and are not reported: the first run of a process tree fills the
persistent compilation cache that later runs reuse, which would flatter whoever runs second.
Reported per configuration (medians over `--repeats` interleaved rounds): steady-state steps/h
(`steps_per_hour_steady` of summary.json: after the compile warm-up), the ratio to `plain`,
groups migrated, drops and max token staleness from the ledger audit (`planner.ledger_audit`),
and the audit verdict. Written to `--out` (default benchmarks/results/tail_runtime.md).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
COMMON = ["policy=lookahead", "max_staleness=1", "engine.replicas=2", "engine.colocate=false",
          "task.lengths=heavy_tail", "max_new_tokens=96", "engine.max_len=128", "engine.stream_every=8"]
CONFIGS = {
    "plain": [],
    "migrate": ["policy.migrate=true"],
    "migrate_spec": ["policy.migrate=true", "engine.speculation.when=critical", "engine.speculation.method=ngram"],
}


def run_config(name: str, steps: int, seed: int, extra: list[str], workdir: Path) -> dict:
    run_dir = workdir / name
    cmd = [sys.executable, "-m", "jaxrl_async.train", *COMMON, *CONFIGS[name], f"steps={steps}", f"seed={seed}",
           "progress=off", "tensorboard=false", "export_hf=false", f"hydra.run.dir={run_dir}", *extra]
    env = {**os.environ, "JAX_PLATFORMS": os.environ.get("JAX_PLATFORMS", "cpu"),
           "XLA_FLAGS": "--xla_force_host_platform_device_count=3"}
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, env=env)
    if not (run_dir / "summary.json").exists():
        raise RuntimeError(f"{name}: run failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    summary = json.loads((run_dir / "summary.json").read_text())
    from planner.ledger_audit import audit

    report = audit(run_dir, summary["max_staleness"])
    return {"config": name, "steps_per_hour": summary["steps_per_hour_steady"],
            "groups_migrated": summary.get("groups_migrated", 0), "drops": report.groups_dropped,
            "max_staleness": report.max_token_staleness, "audit": "PASS" if report.ok else "FAIL",
            "wall_s": summary["elapsed_s"]}


def table(rows: list[dict]) -> str:
    base = rows[0]["steps_per_hour"]
    lines = ["| config | steps/h (steady) | × plain | groups migrated | drops | max staleness | audit |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['config']} | {r['steps_per_hour']:.0f} | {r['steps_per_hour'] / max(base, 1e-9):.2f} | "
                     f"{r['groups_migrated']:.0f} | {r['drops']} | {r['max_staleness']} | {r['audit']} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    own = argv[:argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=3, help="interleaved rounds; the table quotes medians")
    parser.add_argument("--configs", default=",".join(CONFIGS))
    parser.add_argument("--warmup", type=int, default=1,
                        help="untimed rounds first: the first run fills the compilation cache the others reuse")
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "tail_runtime.md"))
    args = parser.parse_args(own)
    names = args.configs.split(",")
    if names[0] != "plain" or any(n not in CONFIGS for n in names):
        parser.error(f"--configs: names from {list(CONFIGS)}, plain first (the ratios' base)")
    runs: dict[str, list[dict]] = {n: [] for n in names}
    for _ in range(args.warmup):
        for name in names:
            with tempfile.TemporaryDirectory() as tmp:
                run_config(name, args.steps, args.seed, extra, Path(tmp))
    for round_ in range(args.repeats):
        for name in names:
            with tempfile.TemporaryDirectory() as tmp:
                runs[name].append(run_config(name, args.steps, args.seed, extra, Path(tmp)))
            print(f"round {round_}: {name} done ({runs[name][-1]['wall_s']:.0f}s)", file=sys.stderr, flush=True)
    rows = []
    for name in names:
        row = dict(runs[name][0])
        for key in ("steps_per_hour", "groups_migrated"):
            row[key] = statistics.median(r[key] for r in runs[name])
        row["drops"] = max(r["drops"] for r in runs[name])
        row["max_staleness"] = max(r["max_staleness"] for r in runs[name])
        row["audit"] = "PASS" if all(r["audit"] == "PASS" for r in runs[name]) else "FAIL"
        rows.append(row)
    text = table(rows)
    print(text)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    setup = f"steps={args.steps} seed={args.seed} repeats={args.repeats} (medians); " + " ".join(COMMON + extra)
    out.write_text(f"# Tail scheduling in real runs: 2 JAX replicas, CPU ({setup})\n\n"
                   f"Command: `python benchmarks/bench_tail_runtime.py {' '.join(argv)}`\n\n{text}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
