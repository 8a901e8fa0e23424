"""Planner benchmark: every policy × η × scenario in the simulator, ratios side by side.

    python benchmarks/bench_planner.py [--seeds 3] [--steps 100] [--etas 1 2 4] [--jobs 2] [--out DIR]
    python benchmarks/bench_planner.py --length-bias-only [...]    # only the length-bias table

Scenarios (docs/design.md §4; issue "Planner" item 6): heavy-tail lengths, bimodal lengths, a
slot-limited engine (max concurrency below the admission quota), uneven workers (drain sync),
worker faults (regenerate). Per policy and cell: groups/hour, trainer and generator busy
fractions, stale drops, end-of-run leftovers, wasted tokens, max and mean staleness, and the
ratio lookahead / policy in groups/hour. Two reference columns: the unbounded-staleness ceiling
(lookahead with η = null) and the strict no-drop upper bound (`planner.compare.no_drop_bound`).

Every figure is the median over seeds; each seed runs every policy on the same workload draw.
Each lookahead run's ledger is audited (`planner.audit`), and so is every run of the other strict
no-drop designs (torchtitan's windowed FIFO, tinker's paced sampling) at its own bound
(`staleness_bound`): a failure aborts the benchmark. The "bound" column is that bound ("–": the
policy bounds nothing). The matched-bound table compares windowed FIFO, strict only at
S + ⌈(W−1)/P⌉ > η, with lookahead run at η = that bound, so both keep the same guarantee.
The ablation table isolates what lookahead's flexibility buys: deadline refinement at start,
the length predictor, and partial rollout vs drain.

The length-bias table (docs/design.md §8.2) compares the drop-based strict baselines with
lookahead on the length-skewed workloads: the KS statistic and mean-length ratio of trained vs
admitted groups, from the workload's true lengths (the simulator's summary), and the audit's
estimate from generated tokens alone — what a real run's ledger holds, where a dropped group
counts only what it had generated. `--length-bias-only` runs just that table (length_bias.md).
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from planner.registry import POLICIES, policy_class
from planner.ledger_audit import audit
from planner.tools.compare import compose, no_drop_bound
from planner.tools.simulate import run_simulation

# A 512-prompt dataset (B=32: an epoch every 16 steps), so prompts recur as in multi-epoch RL.
DATASET = "workload.num_prompts=512"
SCENARIOS: dict[str, list[str]] = {
    "heavy_tail": ["workload=heavy_tail", DATASET, "sim=default"],
    "bimodal": ["workload=bimodal", DATASET, "sim=default"],
    "slot_limited": ["workload=lognormal", DATASET, "sim=slot_limited"],
    "uneven_workers": ["workload=lognormal", DATASET, "sim=uneven"],
    "faults": ["workload=lognormal", DATASET, "sim=fault"],
}
STRICT_RIGIDS = ("nemo_in_order", "nemo_weight_fifo")
NO_DROP_AUDITED = ("lookahead", "torchtitan_windowed_fifo", "tinker_paced")  # audited at their own bound
WINDOWED_FIFO = "torchtitan_windowed_fifo"
LENGTH_BIAS_POLICIES = ("lookahead", "verl_drop", "trl", "prime_rl", "nemo_windowed")
LENGTH_BIAS_SCENARIOS = ("heavy_tail", "bimodal")
ABLATIONS: dict[str, list[str]] = {
    "lookahead": [],
    "lookahead, no refine at start": ["policy.refine_on_start=false"],
    "lookahead + history predictor": ["policy.predictor=history"],
    "lookahead + oracle predictor": ["policy.predictor=oracle"],
}


def run_one(job: tuple[str, str, int | None, int, int, tuple[str, ...]],
            audited_policies: tuple[str, ...] = NO_DROP_AUDITED) -> dict:
    """One simulated run and its row; `audited_policies` (strict, no stale drop) are audited at
    their bound and abort the benchmark on a failure (benchmarks/bench_tail.py audits every peer)."""
    scenario, policy, eta, seed, steps_count, extra = job
    overrides = [*SCENARIOS[scenario], f"policy={policy}", f"max_staleness={'null' if eta is None else eta}",
                 f"seed={seed}", f"steps={steps_count}", *extra]
    config = compose(overrides)
    bound = staleness_bound(config)
    estimate = {"ks": None}
    with tempfile.TemporaryDirectory() as tmp:
        audited = policy in audited_policies or (policy in LENGTH_BIAS_POLICIES and scenario in LENGTH_BIAS_SCENARIOS)
        result = run_simulation(config, tmp if audited else None, plots=False)
        if audited:
            report = audit(tmp, eta if bound is None else bound)
            stale_drops = report.groups_dropped - report.drops_by_reason.get("end_of_run", 0)
            if policy in audited_policies and (not report.ok or stale_drops or (policy == "lookahead" and report.groups_dropped)):
                raise SystemExit(f"{policy} audit failed in {scenario} η={eta} seed={seed}: {report.verdict()}")
            if report.length_bias != result.summary["length_bias"]:  # the ledger's true lengths are the truth
                raise SystemExit(f"{policy} {scenario} η={eta} seed={seed}: the audit's length bias "
                                 f"{report.length_bias} is not the simulator's {result.summary['length_bias']}")
            estimate = real_run_estimate(Path(tmp), eta)
    s = result.summary
    drops = s.get("drops_by_reason", {})
    # Steady state: from step S/5 (after warm-up) to S − η − 2 (before the end of the run, where a
    # policy that over-admits trains its early finishers and leaves the rest as end_of_run drops).
    first, last = steps_count // 5, steps_count - (eta or 0) - 2
    ends = [row["end_s"] for row in result.steps]
    steady = 3600 * config.ctx.batch_groups * (last - first) / (ends[last] - ends[first])
    return {
        "scenario": scenario, "policy": policy, "eta": eta, "seed": seed, "extra": " ".join(extra), "bound": bound,
        "groups_per_hour": s["steps_per_hour"] * config.ctx.batch_groups, "steady_gph": steady,
        "trainer_busy": s["trainer_busy_fraction"], "generator_busy": s["generator_busy_fraction"],
        "stale_drops": s["groups_dropped"] - drops.get("end_of_run", 0),
        "end_of_run": drops.get("end_of_run", 0), "tokens_wasted": s["tokens_wasted"],
        "max_staleness": s["max_token_staleness"], "mean_staleness": s["mean_token_staleness"],
        "deadlock": s.get("deadlock", False),
        # Weight updates (planner/tail_analysis.py update_*): worker time swapping in weights or holding new
        # starts for an update, as a share of all worker time; loads that waited (drain, pinned's K).
        "update_stall": (s["tail"]["update_load_s"] + s["tail"]["update_held_s"])
        / (config.sim.workers.num_workers * s["elapsed_s"]),
        "held_loads": s["weight_updates"]["held_loads"],
        "length_ks": s["length_bias"]["ks"], "length_ratio": s["length_bias"]["mean_length_ratio"],
        "length_ks_estimate": estimate["ks"],
        "tail": s["tail"],  # planner_tail.md, not the CSV (its columns stay as they are)
    }


TAIL_COLUMNS = (  # (header, figure of summary.json's `tail`, planner/tail_analysis.py FIGURES)
    ("trainer wait", lambda t: t["trainer_wait_fraction"], "{:.0%}"),
    ("steps bound by generation", lambda t: t["steps_bound_by_generation"], "{:.0%}"),
    ("wait share, last 5%", lambda t: t["wait_share_last_5pct"], "{:.0%}"),
    ("critical is longest", lambda t: t["critical_is_longest"], "{:.0%}"),
    ("critical decode s", lambda t: t["mean_s"]["critical"]["decode_s"], "{:.0f}"),
    ("other decode s", lambda t: t["mean_s"]["other"]["decode_s"], "{:.0f}"),
    ("critical s/token p50", lambda t: t["decode_s_per_token"]["critical"]["p50"], "{:.4f}"),
    ("other s/token p50", lambda t: t["decode_s_per_token"]["other"]["p50"], "{:.4f}"),
)


def tail_table(rows: list[dict], policies: list[str], etas: list[int], head: str) -> list[str]:
    """Where the tail's time goes, per scenario, policy and η (medians over seeds of each figure)."""
    lines = [head.replace("# Planner benchmark", "# Planner benchmark: the tail"),
             "Per step, the critical group is the batch's last to finish (planner/tail_analysis.py, "
             "docs/tail_analysis.md); \"wait share, last 5%\": the trainer's wait that would vanish if each "
             "batch's last 5% had finished with the rest. Medians over seeds.\n"]
    cells: dict[tuple, list[dict]] = {}
    for r in rows:
        if not r["extra"] and r["eta"] is not None:
            cells.setdefault((r["scenario"], r["policy"], r["eta"]), []).append(r["tail"])
    for sc in SCENARIOS:
        lines += [f"\n## {sc}\n", "| policy | η | " + " | ".join(h for h, _, _ in TAIL_COLUMNS) + " |",
                  "|---|---|" + "---|" * len(TAIL_COLUMNS)]
        for p in policies:
            for eta in etas:
                tails = cells.get((sc, p, eta), [])
                out = []
                for _, get, fmt in TAIL_COLUMNS:
                    values = [v for v in (get(t) for t in tails) if v is not None]
                    out.append(fmt.format(statistics.median(values)) if values else "–")
                lines.append(f"| {p} | {eta} | " + " | ".join(out) + " |")
    return lines


def staleness_bound(config) -> int | None:
    """The policy's own bound for this run (η for most strict policies; None: it bounds nothing)."""
    return config.build_policy().staleness_bound()


def real_run_estimate(run_dir: Path, eta: int | None) -> dict:
    """The audit's length bias from the ledger without the simulator's `length` fields: what a
    real run's ledger supports, where a dropped group counts only its generated tokens."""
    ledger = run_dir / "ledger.jsonl"
    events = [json.loads(line) for line in ledger.read_text().splitlines()]
    ledger.write_text("".join(json.dumps({k: v for k, v in e.items() if k != "length"}) + "\n" for e in events))
    return audit(run_dir, eta).length_bias


def median_rows(rows: list[dict], keys: tuple[str, ...]) -> dict[tuple, dict]:
    cells: dict[tuple, list[dict]] = {}
    for r in rows:
        cells.setdefault(tuple(r[k] for k in keys), []).append(r)
    out = {}
    for key, rs in cells.items():
        m = dict(rs[0])
        for f in ("groups_per_hour", "steady_gph", "trainer_busy", "generator_busy", "stale_drops", "end_of_run",
                  "tokens_wasted", "mean_staleness", "length_ks", "length_ratio", "length_ks_estimate",
                  "update_stall", "held_loads"):
            values = [r[f] for r in rs if r[f] is not None]
            m[f] = statistics.median(values) if values else None
        m["max_staleness"] = max(r["max_staleness"] for r in rs)
        m["deadlock"] = any(r["deadlock"] for r in rs)
        out[key] = m
    return out


def matched_bound_table(med: dict[tuple, dict], matched: dict[tuple, int], etas: list[int]) -> list[str]:
    """Windowed FIFO at η (strict at its realized bound b = S + ⌈(W−1)/P⌉) vs lookahead at η and at b."""
    lines = ["\n## Matched bound: torchtitan windowed FIFO vs lookahead at the same guarantee\n",
             "Windowed FIFO runs with S = η and keeps staleness ≤ b = S + ⌈(W−1)/P⌉ (W = ⌊0.3·(S+1)·B⌋); "
             "lookahead @b runs with η = b, the same guarantee. tinker_paced is strict at η itself.\n",
             "| scenario | η | bound b | windowed FIFO g/h | max / mean stale | lookahead @η g/h | lookahead @b g/h "
             "| max / mean stale | lookahead @b ÷ windowed FIFO | tinker_paced @η g/h |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for (sc, eta), b in matched.items():
        wf, la, lb = (med[(sc, WINDOWED_FIFO, eta, "")], med[(sc, "lookahead", eta, "")], med[(sc, "lookahead", b, "")])
        tp = med.get((sc, "tinker_paced", eta, ""))
        lines.append(f"| {sc} | {eta} | {b} | {wf['groups_per_hour']:.0f} | {wf['max_staleness']} / {wf['mean_staleness']:.2f} "
                     f"| {la['groups_per_hour']:.0f} | {lb['groups_per_hour']:.0f} | {lb['max_staleness']} / "
                     f"{lb['mean_staleness']:.2f} | {lb['groups_per_hour'] / wf['groups_per_hour']:.3f} | "
                     f"{'–' if tp is None else format(tp['groups_per_hour'], '.0f')} |")
    return lines


def length_bias_table(med: dict[tuple, dict], etas: list[int]) -> list[str]:
    lines = ["\n## Length bias: trained vs admitted group lengths (docs/design.md §8.2)\n",
             "KS: two-sample Kolmogorov–Smirnov statistic of per-group completion lengths, admitted vs "
             "trained (0 = the same distribution); ratio: mean trained ÷ mean admitted length. From the "
             "workload's true lengths; the estimate column is the audit's from generated tokens alone "
             "(a real run's ledger). Medians over seeds; drops exclude end-of-run leftovers.\n",
             "| scenario | η | policy | stale drops | end-of-run | KS | mean length ratio | KS estimate (real-run ledger) |",
             "|---|---|---|---|---|---|---|---|"]
    for sc in LENGTH_BIAS_SCENARIOS:
        for eta in etas:
            for p in LENGTH_BIAS_POLICIES:
                m = med[(sc, p, eta, "")]
                lines.append(f"| {sc} | {eta} | {p} | {m['stale_drops']:.0f} | {m['end_of_run']:.0f} | "
                             f"{m['length_ks']:.3f} | {m['length_ratio']:.3f} | {m['length_ks_estimate']:.3f} |")
    return lines


def length_bias_only(args: argparse.Namespace) -> int:
    jobs = [(sc, p, eta, s, args.steps, ()) for sc in LENGTH_BIAS_SCENARIOS for p in LENGTH_BIAS_POLICIES
            for eta in args.etas for s in range(args.seeds)]
    t0 = time.perf_counter()
    with ProcessPoolExecutor(args.jobs) as pool:
        rows = list(pool.map(run_one, jobs, chunksize=2))
    wall = time.perf_counter() - t0
    med = median_rows(rows, ("scenario", "policy", "eta", "extra"))
    head = f"# Length bias ({args.seeds} seeds, {args.steps} steps, medians; {len(rows)} runs in {wall:.0f} s)\n"
    text = "\n".join([head, *length_bias_table(med, args.etas)[1:]]) + "\n"
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "length_bias.md").write_text(text)
    print(text)
    return 0


def add_run_args(ap: argparse.ArgumentParser, *, steps: int) -> None:
    """The options every simulator benchmark takes: seeds, steps, η values, parallel jobs, output folder."""
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=steps)
    ap.add_argument("--etas", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--out", default="benchmarks/results")


def write_runs_csv(path: Path, rows: list[dict]) -> None:
    """One row a run, every column but the `tail` dict (the markdown tables read it); makes the folder."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=[k for k in rows[0] if k != "tail"], extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_run_args(ap, steps=100)
    ap.add_argument("--policies", nargs="+", default=None)
    ap.add_argument("--length-bias-only", action="store_true", help="run only the length-bias table")
    args = ap.parse_args()
    policy_class("lookahead")  # registers every policy
    if args.length_bias_only:
        return length_bias_only(args)
    policies = args.policies or ["lookahead", *sorted(p for p in POLICIES if p != "lookahead")]
    seeds = range(args.seeds)
    jobs = [(sc, p, eta, s, args.steps, ()) for sc in SCENARIOS for p in policies for eta in args.etas for s in seeds]
    jobs += [(sc, "lookahead", None, s, args.steps, ()) for sc in SCENARIOS for s in seeds]
    jobs += [(sc, "lookahead", eta, s, args.steps, tuple(extra)) for name, extra in ABLATIONS.items() if extra
             for sc in SCENARIOS for eta in args.etas for s in seeds]
    jobs += [(sc, p, eta, s, args.steps, ("sim.workers.sync_mode=drain",)) for sc in ("heavy_tail", "slot_limited")
             for p in ("lookahead", *STRICT_RIGIDS) for eta in args.etas for s in seeds]
    matched = {}  # (scenario, η) -> windowed FIFO's realized bound
    if WINDOWED_FIFO in policies:
        matched = {(sc, eta): staleness_bound(compose([*SCENARIOS[sc], f"policy={WINDOWED_FIFO}", f"max_staleness={eta}"]))
                   for sc in SCENARIOS for eta in args.etas}
        jobs += [(sc, "lookahead", b, s, args.steps, ()) for sc, b in sorted(set((sc, b) for (sc, _), b in matched.items()))
                 if b not in args.etas for s in seeds]
    t0 = time.perf_counter()
    with ProcessPoolExecutor(args.jobs) as pool:
        rows = list(pool.map(run_one, jobs, chunksize=4))
    wall = time.perf_counter() - t0
    out = Path(args.out)
    write_runs_csv(out / "planner_runs.csv", rows)

    med = median_rows(rows, ("scenario", "policy", "eta", "extra"))
    bounds = {(sc, eta): no_drop_bound(compose(SCENARIOS[sc] + [f"max_staleness={eta}", f"steps={args.steps}"]), eta)
              * compose(SCENARIOS[sc]).ctx.batch_groups for sc in SCENARIOS for eta in args.etas}
    lines = [f"# Planner benchmark ({args.seeds} seeds, {args.steps} steps, medians; {len(rows)} runs in {wall:.0f} s)\n"]

    lines.append("## lookahead vs the strict no-drop baselines (groups/hour ratio)\n")
    lines.append("Whole run: S steps over the run's simulated time. Steady: steps S/5 .. S−η−2 (no warm-up, no end effect).\n")
    lines.append("| scenario | η | lookahead g/h | ÷ nemo_in_order | ÷ nemo_weight_fifo | ÷ max(both) | steady ÷ max(both) "
                 "| ceiling (η=∞) g/h | no-drop bound g/h |")
    lines.append("|---|---|---|---|---|---|---|---|---|")
    for sc in SCENARIOS:
        ceil = med[(sc, "lookahead", None, "")]["groups_per_hour"]
        for eta in args.etas:
            la = med[(sc, "lookahead", eta, "")]["groups_per_hour"]
            rig = [med[(sc, p, eta, "")]["groups_per_hour"] for p in STRICT_RIGIDS]
            steady = med[(sc, "lookahead", eta, "")]["steady_gph"] / max(
                med[(sc, p, eta, "")]["steady_gph"] for p in STRICT_RIGIDS)
            lines.append(f"| {sc} | {eta} | {la:.0f} | {la / rig[0]:.3f} | {la / rig[1]:.3f} | {la / max(rig):.3f} "
                         f"| {steady:.3f} | {ceil:.0f} | {bounds[(sc, eta)]:.0f} |")

    if matched:
        lines += matched_bound_table(med, matched, args.etas)

    for sc in SCENARIOS:
        lines.append(f"\n## {sc}\n")
        lines.append("| policy | η | bound | groups/h | lookahead ÷ | steady g/h | trainer busy | gen busy | stale drops | "
                     "end-of-run | wasted tokens | max stale | mean stale |")
        lines.append("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
        for p in policies:
            for eta in args.etas:
                m = med[(sc, p, eta, "")]
                la = med[(sc, "lookahead", eta, "")]["groups_per_hour"]
                flag = " (deadlock)" if m["deadlock"] else ""
                bound = "–" if m["bound"] is None else m["bound"]
                lines.append(
                    f"| {p}{flag} | {eta} | {bound} | {m['groups_per_hour']:.0f} | "
                    f"{la / m['groups_per_hour']:.3f} | {m['steady_gph']:.0f} | {m['trainer_busy']:.0%} | {m['generator_busy']:.0%} | "
                    f"{m['stale_drops']:.0f} | {m['end_of_run']:.0f} | {m['tokens_wasted']:.0f} | "
                    f"{m['max_staleness']} | {m['mean_staleness']:.2f} |")

    lines.append("\n## Ablations: what lookahead's flexibility buys (groups/hour ÷ nemo_in_order)\n")
    lines.append("| scenario | η | " + " | ".join(ABLATIONS) + " |")
    lines.append("|---|---|" + "---|" * len(ABLATIONS))
    for sc in SCENARIOS:
        for eta in args.etas:
            base = med[(sc, "nemo_in_order", eta, "")]["groups_per_hour"]
            cells = [med[(sc, "lookahead", eta, " ".join(extra))]["groups_per_hour"] / base for extra in ABLATIONS.values()]
            lines.append(f"| {sc} | {eta} | " + " | ".join(f"{c:.3f}" for c in cells) + " |")

    lines.append("\n## Drain weight sync instead of partial rollout (groups/hour; lookahead ÷ rigid)\n")
    lines.append("| scenario | η | lookahead | nemo_in_order | nemo_weight_fifo | ÷ max(both) | steady ÷ max(both) |")
    lines.append("|---|---|---|---|---|---|---|")
    for sc in ("heavy_tail", "slot_limited"):
        for eta in args.etas:
            cells = [med[(sc, p, eta, "sim.workers.sync_mode=drain")] for p in ("lookahead", *STRICT_RIGIDS)]
            v = [c["groups_per_hour"] for c in cells]
            st = [c["steady_gph"] for c in cells]
            lines.append(f"| {sc} | {eta} | {v[0]:.0f} | {v[1]:.0f} | {v[2]:.0f} | {v[0] / max(v[1:]):.3f} "
                         f"| {st[0] / max(st[1:]):.3f} |")
    if all(p in policies for p in LENGTH_BIAS_POLICIES):
        lines += length_bias_table(med, args.etas)
    text = "\n".join(lines) + "\n"
    (out / "planner.md").write_text(text)
    print(text)
    tail_text = "\n".join(tail_table(rows, policies, args.etas, head=lines[0])) + "\n"
    (out / "planner_tail.md").write_text(tail_text)
    print(tail_text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
