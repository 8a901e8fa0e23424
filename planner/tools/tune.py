"""`python -m planner.tune`: search B, η, an admission cap, engine slots and sync mode in simulation.

    python -m planner.tune target=min_staleness eta=2 budget=40 sim.trainer.c0=60
    python -m planner.tune target=max_throughput eta=2 'space.batch_groups=[16,32,64]' output=json
    python -m planner.tune target=max_staleness eta=1 policy=nemo_in_order workload=bimodal sim=uneven

The base configuration is `planner.simulate`'s: `conf/tune.yaml` lists `conf/simulate.yaml` first,
so every simulate override (policy, workload, sim.*, ...) means the same here, and
`SimulateConfig.from_mapping` validates each candidate exactly as `planner.simulate` would. The
tuner's own keys (`TuneConfig`, defaults here only) are taken out before that.

Targets (docs/tuning.md):
- `max_staleness`: η is fixed to `eta`; the highest throughput wins.
- `max_throughput`: η ∈ {0..eta}; the highest throughput wins.
- `min_staleness`: η ∈ {0..eta}; of the candidates at >= `threshold` (0.98) of the best throughput
  found, the lowest mean token staleness wins.
Throughput is trained tokens per second, not steps per hour: B changes what a step is. Ties go
to the lower mean staleness, then to the earlier grid point. A candidate that deadlocks, or whose
measured max staleness exceeds its η (a non-strict policy), never wins.

Search: the grid of the `space.*` lists; when it has more points than `budget` simulated runs,
a seeded random sample of it (the base config is always run, as the reference). Successive
halving is left out on purpose: a simulated run costs about a second, and short runs rank
configurations by their warm-up, which is what a cap changes least.
Every candidate runs on the same seeds (common random numbers), so same inputs give the same
recommendation, whatever `jobs` is.
"""

from __future__ import annotations

import copy
import itertools
import json
import math
import os
import sys
from collections.abc import Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np

from planner.configs import build, check, register_defaults
from planner.tools import entry
from planner.tools.help import help_text
from planner.tools.simulate import (CONF_DIR, SimulateConfig, help_spec, register_config_nodes, run_simulation,
                                    sim_overrides, with_calibration)

TARGETS = ("max_staleness", "max_throughput", "min_staleness")
OUTPUTS = ("table", "json")
# The policy parameter a cap multiple sets by default: lookahead's cap on admitted, untrained
# groups, since its max_inflight_groups counts only groups still generating (a trainer-bound run
# finishes them quickly, so that cap never binds); the others' own in-flight caps.
CAP_KEYS = {
    "lookahead": "max_untrained_groups", "areal": "max_concurrent_rollouts", "dressage": "max_active_groups",
    "nemo_in_order": "max_inflight_prompts", "nemo_ready_first": "max_inflight_prompts",
    "nemo_weight_fifo": "max_inflight_prompts", "nemo_windowed": "max_inflight_prompts",
    "prime_rl": "max_inflight", "skyrl": "num_parallel_generation_workers",
    "slime": "sglang_server_concurrency", "trl": "max_inflight_tasks",
}
TRAJECTORY_CAPS = ("sglang_server_concurrency", "max_inflight_tasks")  # counted in samples: × group_size
# Caps that never bind at or above B·(η+1) (lookahead's quota bounds |U| there): skipped, not run.
QUOTA_BOUNDED_CAPS = ("max_untrained_groups", "max_inflight_groups")


@dataclass(frozen=True)
class TuneSpace:
    """The lists searched; null = the base config's value only (sync_mode: both modes).

    Attributes:
      batch_groups: B values
      etas: η values; null = [eta] for max_staleness, 0..eta otherwise
      cap_key: the policy parameter the caps set; null = CAP_KEYS[policy]
      caps: caps as multiples of B (samples: × group_size); null = the policy's default
      max_concurrency: engine slots per worker (sim.workers.max_concurrency)
      sync_mode: sim.workers.sync_mode
    """

    batch_groups: list[int] | None = None
    etas: list[int] | None = None
    cap_key: str | None = None
    caps: list[float | None] = field(default_factory=lambda: [None, 1.0, 1.125, 1.25, 1.5, 2.0])
    max_concurrency: list[int] | None = None
    sync_mode: list[str] | None = field(default_factory=lambda: ["partial", "drain"])

    def __post_init__(self) -> None:
        for name in ("batch_groups", "etas", "caps", "max_concurrency", "sync_mode"):
            v = getattr(self, name)
            check(v is None or (isinstance(v, (list, tuple)) and len(v) > 0), f"space.{name}", v,
                  "must be a non-empty list, or null")
        for name, lo in (("batch_groups", 1), ("etas", 0), ("max_concurrency", 1)):
            for x in getattr(self, name) or ():
                check(isinstance(x, int) and not isinstance(x, bool) and x >= lo, f"space.{name}", x,
                      f"entries must be integers >= {lo}")
        for x in self.caps:
            check(x is None or (isinstance(x, (int, float)) and not isinstance(x, bool) and x > 0), "space.caps", x,
                  "entries must be multiples of B > 0, or null for the policy's default")


@dataclass(frozen=True)
class TuneConfig:
    """The tuner's own keys; everything else in the composed config is planner.simulate's.

    Attributes:
      target: max_staleness (η = eta, max throughput) | max_throughput (η <= eta) | min_staleness
        (lowest mean staleness at >= threshold of the best throughput)
      eta: the bound: exact η (max_staleness) or the ceiling X; null = the base max_staleness
      budget: simulated runs in all (candidates × seeds); a larger grid is sampled at random
      threshold: min_staleness: the fraction of the best throughput a winner keeps
      seeds: simulator seeds every candidate runs; null = [seed]
      search_seed: the random sample of a grid larger than the budget
      jobs: processes; null = os.cpu_count()
      top: rows of the table
      output: table | json
      space: the grid searched (`space.*`).
    """

    target: str = "min_staleness"
    eta: int | None = None
    budget: int = 60
    threshold: float = 0.98
    seeds: list[int] | None = None
    search_seed: int = 0
    jobs: int | None = None
    top: int = 10
    output: str = "table"
    space: TuneSpace = field(default_factory=TuneSpace)

    def __post_init__(self) -> None:
        check(self.target in TARGETS, "target", self.target, f"must be one of {', '.join(TARGETS)}")
        check(self.eta is None or (isinstance(self.eta, int) and not isinstance(self.eta, bool) and self.eta >= 0),
              "eta", self.eta, "must be an integer >= 0, or null for the base config's max_staleness")
        check(isinstance(self.budget, int) and not isinstance(self.budget, bool) and self.budget >= 1, "budget",
              self.budget, "must be an integer >= 1 (simulated runs)")
        check(isinstance(self.threshold, (int, float)) and 0 < self.threshold <= 1, "threshold", self.threshold,
              "must be in (0, 1]")
        check(self.seeds is None or (isinstance(self.seeds, (list, tuple)) and len(self.seeds) > 0), "seeds",
              self.seeds, "must be a non-empty list of integers, or null")
        check(self.jobs is None or (isinstance(self.jobs, int) and self.jobs >= 1), "jobs", self.jobs,
              "must be an integer >= 1, or null for every CPU")
        check(isinstance(self.top, int) and self.top >= 1, "top", self.top, "must be an integer >= 1")
        check(self.output in OUTPUTS, "output", self.output, f"must be one of {', '.join(OUTPUTS)}")


@dataclass(frozen=True)
class Candidate:
    """One grid point: what the tuner sets on top of the base config (None = the base's value)."""

    batch_groups: int
    eta: int | None
    cap: float | None  # × B
    max_concurrency: int
    sync_mode: str
    is_base: bool = False


def split(cfg: Mapping[str, Any]) -> tuple[TuneConfig, dict[str, Any]]:
    """The composed `conf/tune.yaml` as (the tuner's config, planner.simulate's mapping)."""
    own = {f: cfg[f] for f in TuneConfig.__dataclass_fields__ if f in cfg}
    return build(TuneConfig, own, ""), {k: v for k, v in cfg.items() if k not in own}


def cap_key(tune: TuneConfig, policy: str) -> str | None:
    key = tune.space.cap_key or CAP_KEYS.get(policy)
    if tune.space.cap_key is None and any(c is not None for c in tune.space.caps) and key is None:
        return None  # a policy without a cap: only its default runs
    return key


def cap_value(key: str, cap: float, batch_groups: int, group_size: int) -> int:
    groups = math.ceil(cap * batch_groups - 1e-9)
    return groups * group_size if key in TRAJECTORY_CAPS else groups


def candidate_mapping(base: Mapping[str, Any], c: Candidate, key: str | None) -> dict[str, Any]:
    m = copy.deepcopy(dict(base))
    m["batch_groups"], m["max_staleness"] = c.batch_groups, c.eta
    if c.cap is not None:
        m["policy"][key] = cap_value(key, c.cap, c.batch_groups, m["group_size"])
    m["sim"].setdefault("workers", {})
    m["sim"]["workers"]["max_concurrency"] = c.max_concurrency
    m["sim"]["workers"]["sync_mode"] = c.sync_mode
    return m


def grid(tune: TuneConfig, base: SimulateConfig) -> tuple[Candidate, list[Candidate], str | None]:
    """(the base config, every other grid point in a fixed order, the cap key)."""
    s, w = tune.space, base.sim.workers
    eta = base.ctx.max_staleness if tune.eta is None else tune.eta
    if eta is None:
        raise ValueError("eta: required when max_staleness is null (the targets need a bound)")
    etas = s.etas or ([eta] if tune.target == "max_staleness" else list(range(eta + 1)))
    for e in etas:
        check(e <= eta if tune.target != "max_staleness" else e == eta, "space.etas", etas,
              f"must be {'= eta' if tune.target == 'max_staleness' else '<= eta'} (eta={eta})")
    key = cap_key(tune, base.policy)
    caps = s.caps if key is not None else [None]
    if key is not None:
        from planner.registry import policy_class

        fields = policy_class(base.policy).Params.__dataclass_fields__
        check(key in fields, "space.cap_key", key, f"not a parameter of policy '{base.policy}' ({', '.join(fields)})")
    base_point = Candidate(base.ctx.batch_groups, base.ctx.max_staleness, None, w.max_concurrency, w.sync_mode, True)
    points = []
    for b, e, cap, slots, mode in itertools.product(
        s.batch_groups or [base.ctx.batch_groups], etas, caps, s.max_concurrency or [w.max_concurrency],
        s.sync_mode or [w.sync_mode],
    ):
        if cap is not None and key in QUOTA_BOUNDED_CAPS and e is not None and cap >= e + 1:
            continue  # the same run as no cap
        c = Candidate(b, e, cap, slots, mode)
        if c != replace(base_point, is_base=False):  # the base runs once, as the reference
            points.append(c)
    return base_point, points, key


def choose(tune: TuneConfig, points: list[Candidate], runs_each: int) -> list[Candidate]:
    """All points when they fit the budget (one run is the base config's), else a seeded sample."""
    room = tune.budget // runs_each - 1
    if room < 0:
        raise ValueError(f"budget={tune.budget}: must be >= {runs_each} (the base config on every seed)")
    if len(points) <= room:
        return points
    picked = np.random.default_rng(tune.search_seed).choice(len(points), size=room, replace=False)
    return [points[i] for i in sorted(picked)]


def _simulate(mapping: Mapping[str, Any]) -> dict[str, Any]:
    s = run_simulation(SimulateConfig.from_mapping(mapping), None, plots=False).summary
    return {k: s[k] for k in ("steps", "tokens_trained", "elapsed_s", "steps_per_hour", "mean_token_staleness",
                              "max_token_staleness", "trainer_busy_fraction", "generator_busy_fraction",
                              "groups_dropped")} | {"deadlock": bool(s.get("deadlock"))}


def evaluate(tune: TuneConfig, base_map: Mapping[str, Any], cands: list[Candidate], key: str | None) -> list[dict]:
    seeds = tune.seeds or [base_map["seed"]]
    maps = [candidate_mapping(base_map, c, key) | {"seed": sd} for c in cands for sd in seeds]
    for m in maps[:: len(seeds)]:
        SimulateConfig.from_mapping(m)  # a bad candidate fails here, before any run
    jobs = min(tune.jobs or os.cpu_count() or 1, len(maps))
    if jobs > 1:
        with ProcessPoolExecutor(max_workers=jobs) as pool:
            results = list(pool.map(_simulate, maps))
    else:
        results = [_simulate(m) for m in maps]
    rows = []
    for i, c in enumerate(cands):
        runs = results[i * len(seeds): (i + 1) * len(seeds)]
        mean = {k: float(np.mean([r[k] for r in runs])) for k in ("steps_per_hour", "mean_token_staleness",
                                                                   "trainer_busy_fraction", "generator_busy_fraction")}
        rows.append({
            **asdict(c), "cap_key": key if c.cap is not None else None,
            "cap_groups": None if c.cap is None else cap_value(key, c.cap, c.batch_groups, base_map["group_size"]),
            "tokens_per_s": float(np.mean([r["tokens_trained"] / r["elapsed_s"] for r in runs])), **mean,
            "max_token_staleness": max(r["max_token_staleness"] or 0 for r in runs),
            "groups_dropped": sum(r["groups_dropped"] for r in runs), "deadlock": any(r["deadlock"] for r in runs),
        })
    return rows


def feasible(row: Mapping[str, Any], tune: TuneConfig, eta: int) -> bool:
    """Meets the bound: no deadlock, η within the target's, and measured staleness within its η."""
    if row["deadlock"] or row["eta"] is None:
        return False
    return row["eta"] <= eta and row["max_token_staleness"] <= row["eta"]


def rank(rows: Sequence[Mapping[str, Any]], tune: TuneConfig, eta: int) -> list[Mapping[str, Any]]:
    """The feasible rows, best first, by the target's rule (module docstring)."""
    ok = [(i, r) for i, r in enumerate(rows) if feasible(r, tune, eta)]
    by_throughput = sorted(ok, key=lambda ir: (-ir[1]["tokens_per_s"], ir[1]["mean_token_staleness"], ir[0]))
    if tune.target != "min_staleness" or not ok:
        return [r for _, r in by_throughput]
    floor = tune.threshold * by_throughput[0][1]["tokens_per_s"]
    keep = sorted((ir for ir in ok if ir[1]["tokens_per_s"] >= floor),
                  key=lambda ir: (ir[1]["mean_token_staleness"], -ir[1]["tokens_per_s"], ir[0]))
    kept = {i for i, _ in keep}
    return [r for _, r in keep] + [r for i, r in by_throughput if i not in kept]


def train_overrides(row: Mapping[str, Any], policy: str, group_size: int) -> list[str]:
    """The `python -m jaxrl_async.train` overrides of a row (engine slots = the engine's num_slots)."""
    eta = "null" if row["eta"] is None else row["eta"]
    out = [f"policy={policy}", f"max_staleness={eta}", f"batch_groups={row['batch_groups']}",
           f"group_size={group_size}"]
    if row["cap_groups"] is not None:
        out.append(f"policy.{row['cap_key']}={row['cap_groups']}")
    return out + [f"engine.num_slots={row['max_concurrency']}", f"engine.sync_mode={row['sync_mode']}"]


def tune(tcfg: TuneConfig, base_map: Mapping[str, Any]) -> dict[str, Any]:
    """Run the search around planner.simulate's mapping `base_map`; the report as plain data."""
    base = SimulateConfig.from_mapping(base_map)
    eta = base.ctx.max_staleness if tcfg.eta is None else tcfg.eta
    base_point, points, key = grid(tcfg, base)
    cands = [base_point, *choose(tcfg, points, len(tcfg.seeds or [0]))]
    rows = evaluate(tcfg, base_map, cands, key)
    ranked = rank(rows, tcfg, eta)
    for r in rows:
        r["train_overrides"] = train_overrides(r, base.policy, base.ctx.group_size)
    best = ranked[0] if ranked else None
    return {
        "target": tcfg.target, "eta": eta, "threshold": tcfg.threshold, "policy": base.policy,
        "search": "grid" if len(cands) == len(points) + 1 else "random", "grid_points": len(points) + 1,
        "runs": len(cands) * len(tcfg.seeds or [0]), "base": rows[0], "recommended": best,
        "top": ranked[: tcfg.top],
        "command": None if best is None else "python -m jaxrl_async.train " + " ".join(best["train_overrides"]),
    }


def print_table(report: Mapping[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    base_tps = report["base"]["tokens_per_s"]
    table = Table(title=f"planner.tune: {report['target']} (η ≤ {report['eta']}), {report['policy']}, "
                        f"{report['runs']} simulated runs, {report['search']} search of {report['grid_points']} points")
    for col in ("#", "B", "η", "cap", "slots", "sync", "tokens/s", "× base", "steps/h", "mean stale", "max stale",
                "trainer busy", "gen busy"):
        table.add_column(col, justify="right")
    rows = list(report["top"]) + ([] if report["base"] in report["top"] else [report["base"]])
    for i, r in enumerate(rows):
        cap = "-" if r["cap_groups"] is None else f"{r['cap_key']}={r['cap_groups']}"
        table.add_row("base" if r["is_base"] else str(i + 1), str(r["batch_groups"]), str(r["eta"]), cap,
                      str(r["max_concurrency"]), r["sync_mode"], f"{r['tokens_per_s']:.1f}",
                      f"{r['tokens_per_s'] / base_tps:.3f}", f"{r['steps_per_hour']:.1f}",
                      f"{r['mean_token_staleness']:.2f}", str(r["max_token_staleness"]),
                      f"{r['trainer_busy_fraction']:.0%}", f"{r['generator_busy_fraction']:.0%}")
    console = Console(width=None if sys.stdout.isatty() else 160)  # a pipe still gets every column
    console.print(table)
    best = report["recommended"]
    if best is None:
        console.print("no candidate meets the target (every one deadlocked or exceeded its η)")
        return
    console.print(f"recommended: {best['steps_per_hour']:.1f} steps/h, {best['tokens_per_s']:.1f} trained tokens/s, "
                  f"mean staleness {best['mean_token_staleness']:.2f}, max {best['max_token_staleness']} "
                  f"(base: {report['base']['tokens_per_s']:.1f} tokens/s, mean staleness "
                  f"{report['base']['mean_token_staleness']:.2f})")
    console.print(report["command"], soft_wrap=True, highlight=False)


def compose(overrides: Sequence[str]) -> dict[str, Any]:
    """`conf/tune.yaml` (planner.simulate's config plus the tuner's keys) with `overrides`, as plain data."""
    register_config_nodes()
    register_defaults({"tune": TuneConfig})
    return entry.compose(CONF_DIR, "tune", overrides)


def prepare(overrides: Sequence[str]) -> tuple[TuneConfig, dict[str, Any]]:
    """The tuner's config and the base mapping of a command line. A `calibration` file is applied
    once, here (under the command line's own `sim.*`), so each candidate's `sim` keys win over it.
    Its compile warm-up (`sim.workers.compile_s`, `sim.trainer.compile_s`: seconds every candidate
    pays alike, which a replay includes to match its run's whole-run figures) is left out unless the
    command line sets it: the tuner ranks what the configurations sustain."""
    tcfg, base_map = split(compose(overrides))
    own = sim_overrides(overrides)
    base_map = with_calibration(base_map, own)
    for part in ("workers", "trainer"):
        if "compile_s" not in own.get(part, {}) and "compile_s" in base_map["sim"].get(part, {}):
            base_map["sim"][part]["compile_s"] = 0.0
    return tcfg, base_map


def main(argv: Sequence[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if entry.wants_help(argv):
        spec = replace(help_spec("python -m planner.tune", __doc__.splitlines()[0].split(": ", 1)[1], {"tune": TuneConfig}),
                       hydra_flags=False)
        print(help_text(CONF_DIR, "tune", spec, argv), end="")
        return
    try:
        tcfg, base_map = prepare(argv)
        report = tune(tcfg, base_map)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)
    if tcfg.output == "json":
        print(json.dumps(report, indent=2))
    else:
        print_table(report)
    if report["recommended"] is None:
        sys.exit(2)  # the table says why


if __name__ == "__main__":
    main()
