"""Multi-turn benchmark: strict policies on episodes with a heavy-tailed environment (issue 25), in the simulator.

    python benchmarks/bench_multi_turn.py [--seeds 3] [--steps 60] [--etas 1 2 4] [--jobs 2] [--out DIR]
                                          [--scenarios multi_turn multi_turn_env]

Two scenarios on the default cluster, where an episode holds an engine slot only during its turns
and waits out its environment steps off the engine (planner/sim/episodes.py): `multi_turn`, the
workload's defaults (planner/sim/workloads.py MultiTurnParams: ~4 turns of ~150 tokens,
environment steps of ~1 s with a 5% Pareto tail from 5 s, a 60 s timeout, 2% failing), where
generation dominates an episode's time; and `multi_turn_env`, environment-bound (steps of ~4 s,
a 10% Pareto tail from 15 s with index 1.2, a 120 s timeout: tools, sandboxes, games against
slow opponents), where the environment takes about half of it. Per scenario and η, side by side:
lookahead without and with tail scheduling (`sim.workers.speculation.when=critical` +
`policy.migrate=true`, acting on the remaining turns only) against the strict no-drop peers
nemo_in_order, nemo_weight_fifo, verl_wait and torchtitan_windowed_fifo; lookahead and each peer
also with the same speculative engine on every sequence (`when=always`), so the engine's gain and
the planner's choice stay apart — the columns and the runs are benchmarks/bench_tail.py's (`cells`,
`bench_planner.run_one`). Every figure is groups/hour as a fraction of the unbounded ceiling
(lookahead, η = null, no speculation), medians over seeds. Every run of lookahead and the peers
is audited at its bound (zero drops for lookahead, no stale drop for any): a failure aborts the
benchmark. torchtitan's windowed FIFO is strict only at its own bound b > η (shown) and enters
the "best strict peer" only where b = η.
"""

from __future__ import annotations

import argparse
import functools
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import bench_planner as bp  # benchmarks/, beside this script: runs and medians
import bench_tail as bt  # its columns (lookahead ± tail, the peers ± the speculative engine)

from planner.registry import policy_class

SCENARIOS = {
    "multi_turn": ["workload=multi_turn", bp.DATASET, "sim=default"],
    "multi_turn_env": ["workload=multi_turn", bp.DATASET, "sim=default", "workload.env_mu=1.386",
                       "workload.env_tail_p=0.1", "workload.env_tail_scale=15", "workload.env_tail_alpha=1.2",
                       "workload.env_timeout_s=120"],
}
for _name, _overrides in SCENARIOS.items():  # bench_planner.run_one reads its scenarios from there
    bp.SCENARIOS.setdefault(_name, _overrides)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    bp.add_run_args(ap, steps=60)
    ap.add_argument("--acceptance", type=float, default=0.7)
    ap.add_argument("--tokens", type=int, default=4)
    ap.add_argument("--draft-cost", type=float, default=0.05)
    ap.add_argument("--scenarios", nargs="+", default=list(SCENARIOS), choices=list(SCENARIOS))
    args = ap.parse_args()
    policy_class("lookahead")  # registers every policy
    # bench_tail's columns less migration alone (the tail column holds it)
    columns = {c: v for c, v in bt.cells(args.acceptance, args.tokens, args.draft_cost).items()
               if c != "lookahead + migrate"}
    jobs, keys = [], []  # keys[i]: (η, column) of jobs[i]
    for sc in args.scenarios:
        for s in range(args.seeds):
            jobs.append((sc, "lookahead", None, s, args.steps, ()))
            keys.append((None, "ceiling"))
            for eta in args.etas:
                for column, (policy, extra) in columns.items():
                    jobs.append((sc, policy, eta, s, args.steps, extra))
                    keys.append((eta, column))
    t0 = time.perf_counter()
    with ProcessPoolExecutor(args.jobs) as pool:
        rows = list(pool.map(functools.partial(bp.run_one, audited_policies=bt.AUDITED), jobs, chunksize=2))
    wall = time.perf_counter() - t0
    for r, (_, column) in zip(rows, keys):
        r["column"] = column
    out = Path(args.out)
    bp.write_runs_csv(out / "multi_turn_runs.csv", rows)
    med = bp.median_rows(rows, ("scenario", "eta", "column"))
    text = "\n".join(report(med, rows, columns, args, wall)) + "\n"
    (out / "multi_turn.md").write_text(text)
    print(text)
    return 0


def env_share(rows: list[dict], sc: str, eta: int | None, column: str) -> float | None:
    """The median share of episode time spent in the environment (the summary's tail split)."""
    shares = sorted(r["tail"]["episodes"]["share"]["environment"] for r in rows
                    if (r["scenario"], r["eta"], r["column"]) == (sc, eta, column) and "episodes" in r["tail"])
    return shares[len(shares) // 2] if shares else None


def report(med: dict, rows: list[dict], columns: dict, args: argparse.Namespace, wall: float) -> list[str]:
    command = " ".join(["python benchmarks/bench_multi_turn.py", *sys.argv[1:]])
    lines = [f"# Multi-turn benchmark ({args.seeds} seeds, {args.steps} steps, medians; {len(rows)} runs in "
             f"{wall:.0f} s)\n",
             f"`{command}`\n",
             "B=32, n=8, sim=default. Fractions of each scenario's ceiling (lookahead, η = ∞). *tail* = lookahead "
             f"with speculation.when=critical + policy.migrate (acceptance {args.acceptance}, k = {args.tokens}, "
             f"draft_cost {args.draft_cost}); *+ always* = the same engine speculating every sequence (lookahead + "
             "always against the best peer + always: the planner's share with the engine matched). *best strict "
             "peer* = the best of nemo_in_order, nemo_weight_fifo, verl_wait (and windowed FIFO where its bound "
             "b = η). *env share* = the share of episode time in environment steps (lookahead's runs). Every run "
             "audited: zero drops for lookahead, no stale drop for any, every trained token within its policy's "
             "bound.\n"]
    for sc in args.scenarios:
        ceil = med[(sc, None, "ceiling")]["groups_per_hour"]
        lines += [f"\n## {sc}: ceiling {ceil:.0f} groups/h\n",
                  "| η | env share | lookahead | tail | " + " | ".join(bt.PEERS) + " | best strict peer "
                  "| lookahead ÷ best | tail ÷ best | best peer + always | lookahead + always ÷ it "
                  "| tail ÷ it | max stale (lookahead, tail) |",
                  "|---|---|---|---|" + "---|" * len(bt.PEERS) + "---|---|---|---|---|---|---|"]
        for eta in args.etas:
            g = {c: med[(sc, eta, c)] for c in columns}
            f = {c: m["groups_per_hour"] / ceil for c, m in g.items()}
            strict = bt.matched(g, eta)
            best = max(f[p] for p in strict)
            best_fast = max(f[f"{p} + always"] for p in strict)
            peers = [f"{f[p]:.0%}" + ("" if g[p]["bound"] in (None, eta) else f" (b={g[p]['bound']})")
                     for p in bt.PEERS]
            share = env_share(rows, sc, eta, "lookahead")
            lines.append(f"| {eta} | {share:.0%} | {f['lookahead']:.0%} | {f['lookahead + tail']:.0%} | "
                         + " | ".join(peers) + f" | {best:.0%} | {f['lookahead'] / best:.3f} "
                         f"| {f['lookahead + tail'] / best:.2f} | {best_fast:.0%} "
                         f"| {f['lookahead + always'] / best_fast:.3f} | {f['lookahead + tail'] / best_fast:.2f} "
                         f"| {g['lookahead']['max_staleness']}, {g['lookahead + tail']['max_staleness']} |")
    return lines

if __name__ == "__main__":
    sys.exit(main())
