"""Tail benchmark: scheduling the straggler's generation (issue 20), in the simulator.

    python benchmarks/bench_tail.py [--seeds 3] [--steps 100] [--etas 1 2 4] [--jobs 2] [--out DIR]

Per cost model, scenario (bench_planner.SCENARIOS) and η: lookahead with tail scheduling
(`sim.workers.speculation.when=critical` + `policy.migrate=true`: the groups the next batch needs
speculate and move to a less loaded worker) against lookahead without it and the strict no-drop
peers nemo_in_order, nemo_weight_fifo, verl_wait and torchtitan_windowed_fifo — each also given
the same speculative engine with `when=always` (every sequence speculates whenever its worker
is weight-bound: what any policy can use). So the table separates the engine's gain (a peer with
and without speculation) from the planner's deadline-aware choice (tail vs the best peer with
the same engine). Every figure is groups/hour as a fraction of the unbounded ceiling (lookahead,
η = null, no speculation: today's async ceiling), medians over seeds.

Cost models: `default` (planner/sim/config.py's defaults: α = 30 ms, β = 0.1 ms per sequence)
and `h200`, the decode step fitted to one H200 (benchmarks/results/decode_h200.md, Qwen2.5-1.5B
shape: 2.31 ms at batch 1, 32.8 ms at 1,024 slots: α = 2.28 ms, β = 29.8 µs per sequence, a
line through those two points), with every other time (prefill, weight load, the trainer's
c0 and c1) scaled by the same factor as α (0.076), so the trainer-to-generator balance stays the
default's and only the shape of the decode step changes (crowding costs 4× more relative to α).

Speculation: acceptance 0.7 (and a sweep), k = `--tokens` (4), draft_cost `--draft-cost` (0.05
of α per drafted token: a draft ~20× cheaper than the policy per token; 0 = n-gram lookup),
max_active 32. torchtitan's windowed FIFO runs at η and is strict only at its own bound b > η
(shown); every other policy is strict at η. Every run of a strict policy is audited at its
bound (bench_planner.run_one): a failure or a stale drop aborts the benchmark.
"""

from __future__ import annotations

import argparse
import csv
import functools
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import bench_planner as bp  # benchmarks/, beside this script: its scenarios, runs and medians

from planner.registry import policy_class

PEERS = ("nemo_in_order", "nemo_weight_fifo", "verl_wait", "torchtitan_windowed_fifo")
RIGIDS = ("nemo_in_order", "nemo_weight_fifo")  # the "best rigid strict no-drop peer"
AUDITED = ("lookahead", *PEERS)
H200_SCALE = 2.28e-3 / 0.03  # α_h200 / α_default: every other time scales with it
COST_MODELS: dict[str, tuple[str, ...]] = {
    "default": (),
    "h200": ("sim.workers.decode_alpha=0.00228", "sim.workers.decode_beta=2.98e-05",
             f"sim.workers.prefill_per_token={2e-5 * H200_SCALE:.4g}", f"sim.workers.t_sync={2.0 * H200_SCALE:.4g}",
             f"sim.trainer.c0={5.0 * H200_SCALE:.4g}", f"sim.trainer.c1={1.5e-4 * H200_SCALE:.4g}"),
}


def spec(when: str, acceptance: float, tokens: int, draft_cost: float) -> tuple[str, ...]:
    p = "sim.workers.speculation"
    return (f"{p}.when={when}", f"{p}.acceptance={acceptance}", f"{p}.tokens={tokens}", f"{p}.draft_cost={draft_cost}")


def cells(acceptance: float, tokens: int, draft_cost: float) -> dict[str, tuple[str, tuple[str, ...]]]:
    """Column name -> (policy, extra overrides) of one (cost model, scenario, η)."""
    always = spec("always", acceptance, tokens, draft_cost)
    out = {"lookahead": ("lookahead", ()),
           "lookahead + tail": ("lookahead", (*spec("critical", acceptance, tokens, draft_cost), "policy.migrate=true")),
           "lookahead + always": ("lookahead", always),
           "lookahead + migrate": ("lookahead", ("policy.migrate=true",))}
    for p in PEERS:
        out[p] = (p, ())
        out[f"{p} + always"] = (p, always)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--etas", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--acceptance", type=float, default=0.7)
    ap.add_argument("--sweep", type=float, nargs="+", default=[0.5, 0.7, 0.9], help="acceptances (heavy_tail)")
    ap.add_argument("--tokens", type=int, default=4)
    ap.add_argument("--draft-cost", type=float, default=0.05)
    ap.add_argument("--models", nargs="+", default=list(COST_MODELS), choices=list(COST_MODELS))
    ap.add_argument("--scenarios", nargs="+", default=list(bp.SCENARIOS), choices=list(bp.SCENARIOS))
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--out", default="benchmarks/results")
    args = ap.parse_args()
    policy_class("lookahead")  # registers every policy
    main_cells = cells(args.acceptance, args.tokens, args.draft_cost)
    jobs, keys = [], []  # keys[i]: (model, scenario, η, column, acceptance) of jobs[i]

    def add(model, sc, eta, column, acc, policy, extra):
        for s in range(args.seeds):
            jobs.append((sc, policy, eta, s, args.steps, (*COST_MODELS[model], *extra)))
            keys.append((model, sc, eta, column, acc))

    for model in args.models:
        for sc in args.scenarios:
            add(model, sc, None, "ceiling", None, "lookahead", ())
            for eta in args.etas:
                for column, (policy, extra) in main_cells.items():
                    add(model, sc, eta, column, args.acceptance, policy, extra)
        if "heavy_tail" in args.scenarios:
            for acc in args.sweep:
                if acc == args.acceptance:
                    continue
                for eta in args.etas:
                    for column, (policy, extra) in cells(acc, args.tokens, args.draft_cost).items():
                        if "always" in column or "tail" in column:  # the others do not depend on the acceptance
                            add(model, "heavy_tail", eta, column, acc, policy, extra)
    t0 = time.perf_counter()
    with ProcessPoolExecutor(args.jobs) as pool:
        rows = list(pool.map(functools.partial(bp.run_one, audited_policies=AUDITED), jobs, chunksize=4))
    wall = time.perf_counter() - t0
    for r, (model, _, _, column, acc) in zip(rows, keys):
        r["cost_model"], r["column"], r["acceptance"] = model, column, acc
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "tail_runs.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    med = bp.median_rows(rows, ("cost_model", "scenario", "eta", "column", "acceptance"))
    text = "\n".join(report(med, args, len(rows), wall)) + "\n"
    (out / "tail.md").write_text(text)
    print(text)
    return 0


def matched(g: dict, eta: int) -> list[str]:
    """The peers strict at η itself (torchtitan's windowed FIFO is strict only at b > η: left out
    of the "best peer" comparison, shown in the per-policy table)."""
    return [p for p in PEERS if g[p]["bound"] in (None, eta)]


def report(med: dict, args: argparse.Namespace, runs: int, wall: float) -> list[str]:
    acc = args.acceptance
    command = " ".join(["python benchmarks/bench_tail.py", *sys.argv[1:]])
    lines = [f"# Tail benchmark ({args.seeds} seeds, {args.steps} steps, medians; {runs} runs in {wall:.0f} s)\n",
             f"`{command}`\n",
             f"Speculation: acceptance {acc}, k = {args.tokens}, draft_cost {args.draft_cost}, max_active 32. "
             "Fractions of the unbounded ceiling (lookahead η = ∞, no speculation). *tail* = lookahead with "
             "when=critical + policy.migrate; *+ always* = the same engine speculating every sequence while "
             "weight-bound. *best peer* = the best of the peers strict at η (nemo_in_order, nemo_weight_fifo, verl_wait; "
             "windowed FIFO only where its bound b = η). Zero drops, exact bound: every strict run audited.\n"]
    for model in args.models:
        lines.append(f"\n## Cost model: {model}\n")
        lines.append("| scenario | η | ceiling g/h | lookahead | + migrate | tail | tail ÷ best rigid (no spec) "
                     "| lookahead + always | best peer + always | tail ÷ best peer + always | max stale (tail) | KS (tail) |")
        lines.append("|---|---|---|---|---|---|---|---|---|---|---|---|")
        for sc in args.scenarios:
            ceil = med[(model, sc, None, "ceiling", None)]["groups_per_hour"]
            for eta in args.etas:
                g = {c: med[(model, sc, eta, c, acc)] for c in cells(acc, args.tokens, args.draft_cost)}
                f = {c: m["groups_per_hour"] / ceil for c, m in g.items()}
                rigid = max(f[p] for p in RIGIDS)
                peer = max(f[f"{p} + always"] for p in matched(g, eta))
                tail = g["lookahead + tail"]
                lines.append(f"| {sc} | {eta} | {ceil:.0f} | {f['lookahead']:.0%} | {f['lookahead + migrate']:.0%} "
                             f"| {f['lookahead + tail']:.0%} "
                             f"| {f['lookahead + tail'] / rigid:.2f} | {f['lookahead + always']:.0%} | {peer:.0%} "
                             f"| {f['lookahead + tail'] / peer:.2f} | {tail['max_staleness']} | {tail['length_ks']:.3f} |")
        lines.append(f"\n### {model}: every policy with and without the speculative engine (fraction of the ceiling)\n")
        lines.append("| scenario | η | " + " | ".join(f"{p} | + always" for p in PEERS) + " |")
        lines.append("|---|---|" + "---|---|" * len(PEERS))
        for sc in args.scenarios:
            ceil = med[(model, sc, None, "ceiling", None)]["groups_per_hour"]
            for eta in args.etas:
                vals = []
                for p in PEERS:
                    plain, fast = med[(model, sc, eta, p, acc)], med[(model, sc, eta, f"{p} + always", acc)]
                    bound = "" if plain["bound"] in (None, eta) else f" (b={plain['bound']})"
                    vals.append(f"{plain['groups_per_hour'] / ceil:.0%}{bound} | {fast['groups_per_hour'] / ceil:.0%}")
                lines.append(f"| {sc} | {eta} | " + " | ".join(vals) + " |")
        if "heavy_tail" in args.scenarios:
            lines.append(f"\n### {model}: acceptance sweep, heavy_tail (fraction of the ceiling)\n")
            lines.append("| acceptance | η | tail | lookahead + always | best peer + always | tail ÷ best peer + always |")
            lines.append("|---|---|---|---|---|---|")
            ceil = med[(model, "heavy_tail", None, "ceiling", None)]["groups_per_hour"]
            for a in sorted(set(args.sweep) | {acc}):
                for eta in args.etas:
                    t = med[(model, "heavy_tail", eta, "lookahead + tail", a)]["groups_per_hour"] / ceil
                    la = med[(model, "heavy_tail", eta, "lookahead + always", a)]["groups_per_hour"] / ceil
                    g = {p: med[(model, "heavy_tail", eta, p, acc)] for p in PEERS}
                    peer = max(med[(model, "heavy_tail", eta, f"{p} + always", a)]["groups_per_hour"]
                               for p in matched(g, eta)) / ceil
                    lines.append(f"| {a} | {eta} | {t:.0%} | {la:.0%} | {peer:.0%} | {t / peer:.2f} |")
    return lines


if __name__ == "__main__":
    sys.exit(main())
