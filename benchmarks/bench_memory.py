"""Peak resident memory and step time of a training recipe (docs/memory.md).

    python benchmarks/bench_memory.py [--experiment smollm2_products12] [--steps 5] [--repeat 1] \
        [--label after] [--out benchmarks/results/memory.md] [-- OVERRIDE ...]

Each repeat is one `python -m jaxrl_async.train +experiment=E steps=N [OVERRIDE ...]` run under
`/usr/bin/time -v`, one after the other (never two at once: they would share the cores and the
memory they measure). It prints, per run:

- `peak_rss_gib`: `/usr/bin/time`'s "Maximum resident set size" of the training process;
- `timeline`: the process's VmRSS sampled every 0.1 s (`/proc/PID/status`), reduced to the peak
  of each phase, told apart by the records in the run's `metrics.jsonl` (`phases`);
- `step_s_median` (and min-max): `metrics.jsonl`'s `train_s` of every step but the first (which
  compiles), and the whole run's wall and CPU seconds;

and appends one row to `--out` (a markdown table) when given. `--` passes the rest to the run as
Hydra overrides (e.g. `-- trainer.remat=none` to measure without a recipe's choice).

TRL side by side: `--trl-python PATH` (the TRL venv's python, benchmarks/bench_trl.py's docstring
says how it is made) then runs TRL 1.16's `GRPOTrainer` on the same recipe (the same prompts in the
same order, the same steps) under `/usr/bin/time -v` after the project's runs, one run at a time,
and prints one table: project vs TRL peak RSS, median step seconds, wall seconds
(`--trl-no-gradient-checkpointing`: TRL without GRPOConfig's default gradient checkpointing).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

GIB = 2**30
MAX_RSS = re.compile(r"Maximum resident set size \(kbytes\): (\d+)")
CPU = re.compile(r"(User|System) time \(seconds\): ([\d.]+)")


def max_rss_gib(time_v_output: str) -> float:
    """`/usr/bin/time -v`'s peak resident set size, in GiB."""
    found = MAX_RSS.search(time_v_output)
    if found is None:
        raise ValueError("no 'Maximum resident set size' in the /usr/bin/time -v output")
    return int(found.group(1)) * 1024 / GIB


def cpu_seconds(time_v_output: str) -> float:
    """`/usr/bin/time -v`'s user + system seconds."""
    return sum(float(v) for _, v in CPU.findall(time_v_output))


def vm_rss(pid: int) -> int | None:
    """The process's resident bytes now, or None once it is gone."""
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except (FileNotFoundError, ProcessLookupError):
        return None
    return None


def steps_done(run_dir: Path) -> int:
    """Steps whose record is in `metrics.jsonl` (one line each, flushed at the step's end)."""
    path = run_dir / "metrics.jsonl"
    return path.read_text().count("\n") if path.exists() else 0


def sample_rss(parent: subprocess.Popen, run_dir: Path, samples: list[tuple[int, int]], every_s: float = 0.1) -> None:
    """Sample the training process (the child of `/usr/bin/time`) until it ends, each sample
    as (steps done, resident bytes)."""
    child = None
    while parent.poll() is None:
        if child is None:
            kids = Path(f"/proc/{parent.pid}/task/{parent.pid}/children")
            text = kids.read_text().split() if kids.exists() else []
            child = int(text[0]) if text else None
        if child is not None and (rss := vm_rss(child)) is not None:
            samples.append((steps_done(run_dir), rss))
        time.sleep(every_s)


def phases(samples: list[tuple[int, int]], steps: int) -> list[tuple[str, float]]:
    """Peak VmRSS (GiB) by phase: start-up and step 0 (load, engine, trainer, first compile),
    each later step (its generation and its train step), after the last step (the final
    checkpoint, the HF export)."""
    def name(k: int) -> str:
        return ("start-up and step 0" if k == 0 else "after the last step" if k >= steps else f"step {k}")
    peaks: dict[str, int] = {}
    for k, rss in samples:
        peaks[name(k)] = max(peaks.get(name(k), 0), rss)
    return [(k, v / GIB) for k, v in peaks.items()]


def run_once(experiment: str, steps: int, overrides: list[str], root: Path) -> dict:
    run_dir = root / f"run_{time.monotonic_ns()}"
    cmd = ["/usr/bin/time", "-v", sys.executable, "-m", "jaxrl_async.train", f"+experiment={experiment}",
           f"steps={steps}", "progress=plain", f"hydra.run.dir={run_dir}", *overrides]
    samples: list[tuple[int, int]] = []
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    sampler = threading.Thread(target=sample_rss, args=(proc, run_dir, samples), daemon=True)
    sampler.start()
    _, err = proc.communicate()
    wall = time.monotonic() - t0
    sampler.join()
    if proc.returncode != 0:
        raise SystemExit(f"bench_memory: the run failed (exit {proc.returncode}):\n{err[-3000:]}")
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    train_s = [m["train_s"] for m in metrics if "train_s" in m][1:]  # the first step compiles
    cpu = cpu_seconds(err)
    shutil.rmtree(run_dir)  # its checkpoints and export: ~2 GB a run of SmolLM2
    return {
        "peak_rss_gib": max_rss_gib(err),
        "timeline": phases(samples, steps),
        "step_s_median": statistics.median(train_s) if train_s else float("nan"),
        "step_s_range": (min(train_s), max(train_s)) if train_s else (float("nan"),) * 2,
        "wall_s": wall,
        "cpu_s": cpu,
        "load": os.getloadavg()[0],
    }


def split_overrides(argv: list[str] | None) -> tuple[list[str], list[str]]:
    """(the script's own arguments, the Hydra overrides after `--`) of `argv` (None: sys.argv)."""
    argv = sys.argv[1:] if argv is None else argv
    if "--" not in argv:
        return argv, []
    cut = argv.index("--")
    return argv[:cut], argv[cut + 1:]


def table_row(out: Path, label: str, experiment: str, steps: int, overrides: str, r: dict) -> None:
    """Append one run's row to the markdown table `out` (its header first when it is new)."""
    lo, hi = r["step_s_range"]
    new = not out.exists()
    with out.open("a") as fh:
        if new:
            fh.write("| label | experiment | steps | overrides | peak RSS GiB | step s median (range) "
                     "| wall s | CPU s | load |\n|---|---|---|---|---|---|---|---|---|\n")
        fh.write(f"| {label} | {experiment} | {steps} | {overrides} | {r['peak_rss_gib']:.2f} | "
                 f"{r['step_s_median']:.2f} ({lo:.2f}-{hi:.2f}) | {r['wall_s']:.0f} | {r['cpu_s']:.0f} | "
                 f"{r['load']:.1f} |\n")


def side_by_side(ours: list[dict], trl: dict) -> str:
    """One table: each of the project's runs, then TRL's, on the same recipe and steps."""
    lines = ["| trainer | peak RSS GiB | step s median | wall s |", "|---|---|---|---|"]
    for i, r in enumerate(ours):
        lines.append(f"| jaxrl-async (run {i}; step = train_s) | {r['peak_rss_gib']:.2f} | "
                     f"{r['step_s_median']:.2f} | {r['wall_s']:.0f} |")
    checkpointing = "on" if trl["gradient_checkpointing"] else "off"
    lines.append(f"| TRL {trl['versions']['trl']} GRPOTrainer (step = generation + train; gradient "
                 f"checkpointing {checkpointing}) | "
                 f"{trl['peak_rss_gib']:.2f} | {trl['step_s_median']:.2f} | {trl['wall_s']:.0f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    argv, overrides = split_overrides(argv)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--experiment", default="smollm2_products12")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--label", default="")
    parser.add_argument("--out", type=Path, default=None, help="append a row to this markdown table")
    parser.add_argument("--trl-python", type=Path, default=None,
                        help="then run TRL's GRPOTrainer on the same recipe with this python (bench_trl.py)")
    parser.add_argument("--trl-no-gradient-checkpointing", action="store_true",
                        help="TRL's side without GRPOConfig's default gradient_checkpointing=True")
    args = parser.parse_args(argv)
    if args.trl_python is not None and overrides:
        raise SystemExit(f"bench_memory: --trl-python with overrides {overrides}: the TRL side runs the recipe "
                         "as composed, so it would not be the same run")
    if args.trl_python is not None and not args.trl_python.exists():
        raise SystemExit(f"bench_memory: --trl-python {args.trl_python} does not exist (bench_trl.py's docstring)")
    ours = []
    with tempfile.TemporaryDirectory(prefix="bench_memory_") as root:
        for i in range(args.repeat):
            r = run_once(args.experiment, args.steps, overrides, Path(root))
            ours.append(r)
            lo, hi = r["step_s_range"]
            print(f"[{args.label or 'run'} {i}] peak RSS {r['peak_rss_gib']:.2f} GiB; step {r['step_s_median']:.2f} s "
                  f"median ({lo:.2f}-{hi:.2f}) over {args.steps - 1} steps; wall {r['wall_s']:.0f} s, "
                  f"CPU {r['cpu_s']:.0f} s; load {r['load']:.1f}")
            for name, gib in r["timeline"]:
                print(f"    {name:24s} peak {gib:.2f} GiB")
            if args.out is not None:
                table_row(args.out, args.label, args.experiment, args.steps, " ".join(overrides), r)
    if args.trl_python is not None:
        from bench_trl import measure, summary_line  # beside this file; imports no TRL itself

        trl = measure(args.experiment, args.steps, args.trl_python, not args.trl_no_gradient_checkpointing)
        print(summary_line("trl", trl, args.steps))
        if args.out is not None:
            table_row(args.out, "trl", args.experiment, args.steps, "trl GRPOTrainer", trl)
        print(side_by_side(ours, trl))


if __name__ == "__main__":
    main()
