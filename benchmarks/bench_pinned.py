"""Pinned benchmark: version-pinned generation against partial rollout and drain (issue 26 item 3).

    python benchmarks/bench_pinned.py [--seeds 3] [--steps 100] [--etas 1 2] [--jobs 2] [--out DIR]

Per scenario (the default workload — log-normal lengths on the default cluster — and heavy_tail,
bench_planner.SCENARIOS) and η, each strict no-drop policy under the three ways a worker takes new
weights (`sim.workers.sync_mode`, docs/design.md §4):

- partial: load now (t_sync = 2 s of stalled decoding), in-flight samples continue on the new
  weights — a sequence mixes versions;
- drain: hold new starts until in-flight samples finish, then load (t_sync);
- pinned: the update is one more resident version (LoRA adapters), no swap time, in-flight samples
  finish on their version; K = `sim.workers.resident_versions` (default 4) resident versions.

Policies: lookahead with and without tail scheduling (`speculation.when=critical` +
`policy.migrate=true`, bench_tail's "tail") and the strict peers nemo_in_order, nemo_weight_fifo,
verl_wait. Every figure is groups/hour as a fraction of the unbounded ceiling (lookahead, η = null,
partial: today's async ceiling), medians over seeds; every run is audited at η
(bench_planner.run_one: zero stale drops, exact bound, or the benchmark aborts). The stall columns
are the tail analysis's weight-update terms (planner/tail_analysis.py `update_load_s` +
`update_held_s`) as a share of all worker time: what pinning removes. A second table sweeps K for
lookahead: K = 1 (every update waits for the one resident version to free: drain at no swap cost),
K = η and K = η + 1 (enough for a strict no-drop policy: no update waits, docs/design.md §4).
"""

from __future__ import annotations

import argparse
import functools
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import bench_planner as bp  # benchmarks/, beside this script: its scenarios, runs and medians
from bench_tail import spec

from planner.registry import policy_class

SCENARIOS = {"default": ["workload=lognormal", bp.DATASET, "sim=default"], "heavy_tail": bp.SCENARIOS["heavy_tail"]}
MODES = ("partial", "drain", "pinned")
PEERS = ("nemo_in_order", "nemo_weight_fifo", "verl_wait")
TAIL = (*spec("critical", 0.7, 4, 0.05), "policy.migrate=true")  # bench_tail's "tail" at its defaults
COLUMNS: dict[str, tuple[str, tuple[str, ...]]] = {
    "lookahead": ("lookahead", ()), "lookahead + tail": ("lookahead", TAIL), **{p: (p, ()) for p in PEERS}}
AUDITED = ("lookahead", *PEERS)


def mode(name: str, k: int | None = None) -> tuple[str, ...]:
    return (f"sim.workers.sync_mode={name}", *(() if k is None else (f"sim.workers.resident_versions={k}",)))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--etas", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--out", default="benchmarks/results")
    args = ap.parse_args()
    policy_class("lookahead")  # registers every policy
    jobs, keys = [], []  # keys[i]: (scenario, η, column, mode, K) of jobs[i]

    def add(sc, eta, column, policy, extra, m, k=None):
        for s in range(args.seeds):
            jobs.append((sc, policy, eta, s, args.steps, (*extra, *mode(m, k))))
            keys.append((sc, eta, column, m, k))

    for sc in SCENARIOS:
        add(sc, None, "ceiling", "lookahead", (), "partial")
        for eta in args.etas:
            for column, (policy, extra) in COLUMNS.items():
                for m in MODES:
                    add(sc, eta, column, policy, extra, m)
            for k in sorted({1, eta, eta + 1}):
                add(sc, eta, "lookahead", "lookahead", (), "pinned", k)
    bp.SCENARIOS.update(SCENARIOS)  # run_one reads its scenario's overrides there (and so do the workers)
    t0 = time.perf_counter()
    with ProcessPoolExecutor(args.jobs, initializer=bp.SCENARIOS.update, initargs=(SCENARIOS,)) as pool:
        rows = list(pool.map(functools.partial(bp.run_one, audited_policies=AUDITED), jobs, chunksize=2))
    wall = time.perf_counter() - t0
    for r, (_, _, column, m, k) in zip(rows, keys):
        r["column"], r["mode"], r["k"] = column, m, k
    bad = [r for r in rows if r["deadlock"] or (r["eta"] is not None and r["max_staleness"] > r["eta"])]
    if bad:
        raise SystemExit(f"{len(bad)} runs deadlocked or broke the bound: {bad[0]}")
    out = Path(args.out)
    bp.write_runs_csv(out / "pinned_runs.csv", rows)
    med = bp.median_rows(rows, ("scenario", "eta", "column", "mode", "k"))
    text = "\n".join(report(med, args, len(rows), wall)) + "\n"
    (out / "pinned.md").write_text(text)
    print(text)
    return 0


def report(med: dict, args: argparse.Namespace, runs: int, wall: float) -> list[str]:
    command = " ".join(["python benchmarks/bench_pinned.py", *sys.argv[1:]])
    lines = [f"# Pinned benchmark ({args.seeds} seeds, {args.steps} steps, medians; {runs} runs in {wall:.0f} s)\n",
             f"`{command}`\n",
             "Groups/hour as a fraction of the unbounded ceiling (lookahead η = ∞, partial). *stall* = worker time "
             "swapping in weights (t_sync = 2 s a load) or holding new starts for an update (drain's drain, pinned's "
             "wait for a resident slot), share of all worker time (the tail analysis's update_load_s + "
             "update_held_s). pinned: K = 4 resident versions. *tail* = lookahead with speculation.when=critical + "
             "policy.migrate. Zero stale drops and the exact bound: every run audited at η.\n",
             "| scenario | η | policy | partial | drain | pinned | pinned ÷ partial | pinned ÷ drain "
             "| stall partial | stall drain | stall pinned |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for sc in SCENARIOS:
        ceil = med[(sc, None, "ceiling", "partial", None)]["groups_per_hour"]
        for eta in args.etas:
            for column in COLUMNS:
                g = {m: med[(sc, eta, column, m, None)] for m in MODES}
                f = {m: g[m]["groups_per_hour"] / ceil for m in MODES}
                lines.append(f"| {sc} | {eta} | {column} | {f['partial']:.0%} | {f['drain']:.0%} | {f['pinned']:.0%} "
                             f"| {f['pinned'] / f['partial']:.2f} | {f['pinned'] / f['drain']:.2f} | "
                             + " | ".join(f"{g[m]['update_stall']:.1%}" for m in MODES) + " |")
    lines += ["\n## Resident versions K (lookahead, pinned)\n",
              "Loads that waited for a resident slot (median per run) and the fraction of the ceiling. A strict "
              "no-drop policy trains every running group at a step >= the loading version v, so its versions lie in "
              "[v − η, v − 1]: K = η + 1 never waits.\n",
              "| scenario | η | K | fraction | loads that waited | stall |", "|---|---|---|---|---|---|"]
    for sc in SCENARIOS:
        ceil = med[(sc, None, "ceiling", "partial", None)]["groups_per_hour"]
        for eta in args.etas:
            for k in sorted({1, eta, eta + 1}):
                m = med[(sc, eta, "lookahead", "pinned", k)]
                lines.append(f"| {sc} | {eta} | {k} | {m['groups_per_hour'] / ceil:.0%} | {m['held_loads']:.0f} "
                             f"| {m['update_stall']:.1%} |")
    return lines


if __name__ == "__main__":
    sys.exit(main())
