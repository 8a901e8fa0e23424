"""`python -m planner.compare`: policies × η × workloads in one command, with reference columns.

    python -m planner.compare policies=[nemo_in_order,lookahead] etas=[1,2,4] \
        workloads=[lognormal,bimodal] out=compare_out steps=200 sim=uneven

`policies`, `etas`, `workloads`, `out`, `reference_policy` (default lookahead), `gantt_policy`
(default lookahead), `gantt.start` and `gantt.steps` (the Gantt's window: the groups admitted at
versions start … start + steps − 1, default 0 and 6) belong to compare; every other `key=value` is
a `planner.simulate` override applied to every run. Writes `results.md` (also printed),
`results.csv`, and per workload: throughput vs η (runs that dropped groups marked with their
count), staleness histograms, trainer/generator utilisation over time, and the Gantt of
`gantt_policy`'s schedule (from its ledger: admit, move, train, drop). Each run's contract files
are in `out/<workload>/<policy>/eta<η>/`.

Two reference columns per workload:

- `unbounded_ceiling`: `reference_policy` with `max_staleness=null` — the async throughput
  ceiling, what any bound costs is measured against it.
- `no_drop_bound(η)`: an upper bound on the steps/hour of *any* strict no-drop policy.
  A strict no-drop run keeps |U| (admitted, untrained groups) ≤ B(η+1): a group admitted at
  version a ≤ k (the trainer step) must be trained by step a+η, so at most B(η+1) can be owed.
  By Little's law the group rate λ = E|U| / E[W] ≤ B(η+1) / E[W], with W the time from admission
  to training; steps/s = λ/B ≤ (η+1)/E[W]. W is at least the group's generation time alone on the
  fastest worker, `prefill + max_i len_i · (α + β·n) / speed_max`, so with E over the workload
  this gives a valid (optimistic) bound. It is capped by the generation capacity
  (Σ_w speed_w·C/(α+β·C) tokens/s with C = max_concurrency, over B·n·E[len] tokens a step) and by
  the trainer (1 / E[c0 + c1·tokens a step]). The bound is loose at small η only through the
  optimistic W; it shows how much of the gap to the ceiling the bound itself forces.
  Being optimistic it can exceed the measured ceiling, a whole run of `reference_policy` with its
  start-up (the first batch generates before the trainer can start) and its queueing: typically where
  the trainer or capacity cap binds, or at larger η, where (η+1)/E[W] grows. There it binds nothing,
  so the table and the plot show it capped at the ceiling — the table marks such a cell `*` with a
  note under it — and `results.csv` keeps the bound itself.
"""

from __future__ import annotations

import csv
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from planner.sim.metrics import read_steps
from planner.tools import entry
from planner.tools.simulate import CONF_DIR, SimulateConfig, register_config_nodes, run_simulation

GANTT_START, GANTT_STEPS = 0, 6  # the Gantt's default window: groups admitted at versions 0-5
OWN_KEYS = ("policies", "etas", "workloads", "out", "reference_policy", "gantt_policy", "gantt.start", "gantt.steps")
CSV_COLUMNS = (
    "workload", "policy", "eta", "steps_per_hour", "unbounded_ceiling", "no_drop_bound", "max_token_staleness",
    "mean_token_staleness", "groups_dropped", "tokens_wasted", "trainer_busy_fraction", "generator_busy_fraction",
    "deadlock",
)


def parse_args(argv: Sequence[str]) -> tuple[dict[str, Any], list[str]]:
    own: dict[str, Any] = {"out": "compare_out", "reference_policy": "lookahead", "gantt_policy": "lookahead",
                           "workloads": ["lognormal"], "etas": [1, 2, 4], "gantt.start": GANTT_START,
                           "gantt.steps": GANTT_STEPS}
    passthrough = []
    for arg in argv:
        key, sep, value = arg.partition("=")
        if not sep:
            raise ValueError(f"{arg}: expected key=value")
        if key in OWN_KEYS:
            own[key] = yaml.safe_load(value)
        else:
            passthrough.append(arg)
    if "policies" not in own:
        raise ValueError("policies: required, e.g. policies=[nemo_in_order,lookahead]")
    for key in ("policies", "etas", "workloads"):
        if not isinstance(own[key], list) or not own[key]:
            own[key] = [own[key]]
    for eta in own["etas"]:
        if isinstance(eta, bool) or not isinstance(eta, int) or eta < 0:
            raise ValueError(f"etas: {eta!r} must be integers >= 0")
    for key, least in (("gantt.start", 0), ("gantt.steps", 1)):
        value = own[key]
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise ValueError(f"{key}={value!r}: must be an integer >= {least}")
    return own, passthrough


def compose(overrides: Sequence[str]) -> SimulateConfig:
    register_config_nodes()
    return SimulateConfig.from_mapping(entry.compose(CONF_DIR, "simulate", overrides))


def no_drop_bound(config: SimulateConfig, eta: int, samples: int = 20_000) -> float:
    """Steps/hour no strict no-drop policy can beat (module docstring)."""
    ctx, w, t = config.ctx, config.sim.workers, config.sim.trainer
    draws = config.build_workload().sample(np.random.default_rng(12345), samples)
    speeds = np.array(w.speeds or [1.0] * w.num_workers)
    n = ctx.group_size
    gen = draws.prompt_tokens * w.prefill_per_token / speeds.max() + draws.lengths.max(axis=1) * (
        w.decode_alpha + w.decode_beta * n) / speeds.max()
    little = (eta + 1) / gen.mean()
    c = w.max_concurrency
    capacity = (speeds * c / (w.decode_alpha + w.decode_beta * c)).sum() / (ctx.batch_groups * n * draws.lengths.mean())
    step_tokens = ctx.batch_groups * n * (draws.lengths.mean() + draws.prompt_tokens.mean())
    trainer = 1.0 / (t.c0 + t.c1 * step_tokens)
    return 3600.0 * min(little, capacity, trainer)


CAPPED = "*"  # marks a no-drop bound shown capped at the ceiling (CAPPED_NOTE)
CAPPED_NOTE = (f"{CAPPED} capped at the ceiling: the no-drop bound (results.csv `no_drop_bound`) is above the "
               "measured ceiling here. It is an optimistic upper bound (no start-up, no queueing, a group's wait its "
               "generation alone), so there it binds nothing: the ceiling is the limit.")


def bound_cell(bound: float, ceiling: float) -> str:
    """The no-drop bound as the table prints it: never above the ceiling (CAPPED_NOTE)."""
    return f"{bound:.1f}" if bound <= ceiling else f"{ceiling:.1f}{CAPPED}"


def markdown(rows: Sequence[Mapping[str, Any]]) -> str:
    head = ("workload", "policy", "η", "steps/h", "% of ceiling", "ceiling (η=∞)", "no-drop bound", "max stale",
            "dropped", "wasted tokens", "trainer busy", "gen busy")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        lines.append("| " + " | ".join([
            r["workload"], r["policy"], str(r["eta"]), f"{r['steps_per_hour']:.1f}",
            f"{100 * r['steps_per_hour'] / r['unbounded_ceiling']:.0f}%", f"{r['unbounded_ceiling']:.1f}",
            bound_cell(r["no_drop_bound"], r["unbounded_ceiling"]), str(r["max_token_staleness"]),
            str(r["groups_dropped"]), str(r["tokens_wasted"]), f"{r['trainer_busy_fraction']:.0%}",
            f"{r['generator_busy_fraction']:.0%}",
        ]) + " |")
    if any(r["no_drop_bound"] > r["unbounded_ceiling"] for r in rows):
        lines += ["", CAPPED_NOTE]
    return "\n".join(lines) + "\n"


def run_compare(argv: Sequence[str]) -> list[dict[str, Any]]:
    from tqdm import tqdm

    from planner.tools import plots as P

    own, passthrough = parse_args(argv)
    out = Path(own["out"])
    jobs = [(wl, None, None) for wl in own["workloads"]]
    jobs += [(wl, p, eta) for wl in own["workloads"] for p in own["policies"] for eta in own["etas"]]
    configs = {}  # validate every run before the first one starts
    for wl, policy, eta in jobs:
        over = [*passthrough, f"workload={wl}", f"policy={policy or own['reference_policy']}",
                f"max_staleness={'null' if eta is None else eta}"]
        configs[wl, policy, eta] = compose(over)
    out.mkdir(parents=True, exist_ok=True)  # after the checks: a rejected command leaves no folder
    rows, ceiling, summaries = [], {}, {}
    for wl, policy, eta in tqdm(jobs, desc="compare", unit="run"):
        name = policy or f"{own['reference_policy']}_unbounded"
        run_dir = out / wl / name / ("eta_inf" if eta is None else f"eta{eta}")
        result = run_simulation(configs[wl, policy, eta], run_dir, plots=False)
        s = result.summary
        summaries[wl, policy, eta] = (s, run_dir)
        if policy is None:
            ceiling[wl] = s["steps_per_hour"]
            continue
        row = {"workload": wl, "policy": policy, "eta": eta, "unbounded_ceiling": ceiling[wl],
               "no_drop_bound": no_drop_bound(configs[wl, policy, eta], eta)}
        row.update({k: s[k] for k in CSV_COLUMNS if k not in row})
        rows.append(row)
    with open(out / "results.csv", "w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, fieldnames=CSV_COLUMNS)
        writer.writeheader()
        writer.writerows({k: r[k] for k in CSV_COLUMNS} for r in rows)
    table = markdown(rows)
    (out / "results.md").write_text(table, encoding="utf-8")
    print(table)
    for wl in own["workloads"]:
        wl_rows = [r for r in rows if r["workload"] == wl]
        P.throughput_vs_eta(wl_rows, out / f"{wl}_throughput_vs_eta.png", title=f"workload {wl}")
        eta0 = own["etas"][0]
        P.staleness_histograms({p: summaries[wl, p, eta0][0] for p in own["policies"]},
                               out / f"{wl}_staleness_eta{eta0}.png", title=f"{wl}, η={eta0}")
        for p in own["policies"]:
            run_dir = summaries[wl, p, eta0][1]
            P.utilisation(read_steps(run_dir / "metrics.jsonl"), out / f"{wl}_{p}_utilisation_eta{eta0}.png",
                          title=f"{p}, {wl}, η={eta0}")
        if own["gantt_policy"] in own["policies"]:
            run_dir = summaries[wl, own["gantt_policy"], eta0][1]
            P.schedule_gantt(run_dir / "ledger.jsonl", out / f"{wl}_{own['gantt_policy']}_gantt_eta{eta0}.png",
                             start=own["gantt.start"], steps=own["gantt.steps"])
    return rows


def main() -> None:
    if entry.wants_help(sys.argv[1:]):
        print(__doc__.split("\nTwo reference columns")[0].rstrip()
              + "\n\nEvery other KEY=VALUE is planner.simulate's: python -m planner.simulate --help lists them.")
        return
    try:
        run_compare(sys.argv[1:])
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
