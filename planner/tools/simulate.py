"""`python -m planner.simulate`: run one policy on the simulated cluster (docs/design.md §4, §8).

    python -m planner.simulate policy=nemo_in_order max_staleness=2 batch_groups=32 group_size=8 \
        steps=200 seed=0 workload=trace workload.path=FILE sim=uneven hydra.run.dir=DIR
    python -m planner.simulate -m policy=nemo_in_order,lookahead max_staleness=1,2,4

Hydra composes `conf/simulate.yaml`; `SimulateConfig.from_mapping` turns the result into typed,
validated objects once, here. Bad input (unknown key, η < 0, a non-positive batch, an unknown
policy) is one line on stderr and exit status 1. The run directory receives `summary.json`,
`ledger.jsonl`, `metrics.jsonl` and two plots (`staleness_hist.png`, `utilisation.png`).

`calibration=FILE` (a `planner.calibrate` output, docs/calibration.md) sets the cluster from a
real run's fit: its `sim:` mapping goes over the `sim=` group's file and under the command line's
own `sim.*` overrides, so `calibration=F sim.workers.load_lag=0` changes one fitted value. It does
not set the planner context: a run that differs from the calibrated run's (its `run:` mapping:
policy, η, B, n, steps) says so on stderr, with the replay command `planner.calibrate` printed.
The last line printed names the run directory.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from planner.configs import build, check, check_keys, register_defaults
from planner.ledger import LEDGER_FILE, LedgerWriter
from planner.registry import given_params, make_policy, policy_class
from planner.sim.config import SimConfig
from planner.sim.metrics import write_outputs
from planner.sim.recorder import EventRecorder
from planner.sim.result import SimResult
from planner.sim.simulator import Simulator
from planner.sim.episodes import idle_keys
from planner.sim.workloads import WORKLOADS, Workload, make_workload
from planner.tools.entry import Command, fail, hydra_main
from planner.tools.help import HelpSpec
from planner.types import PlanContext

CONF_DIR = Path(__file__).resolve().parents[2] / "conf"
CALIBRATION_KEYS = ("sim", "fit", "run")  # fit and run are for people; only sim is applied


def config_nodes() -> dict[str, type]:
    """Base node path -> the simulator dataclass whose defaults it holds."""
    return {"sim": SimConfig, **{f"workload/{name}": w.Params for name, w in WORKLOADS.items()}}


def register_config_nodes() -> None:
    """The simulator's config dataclasses' defaults as Hydra nodes (`base/sim`,
    `base/workload/<name>`), which `conf/sim/default.yaml` and `conf/workload/*.yaml` list first:
    the defaults live in the dataclasses only. Call it before composing `conf/simulate.yaml`."""
    register_defaults(config_nodes())


def help_spec(prog: str, summary: str, nodes: Mapping[str, type] | None = None) -> HelpSpec:
    """What `--help` reads for the commands on conf/simulate.yaml (simulate; tune adds `nodes`)."""
    return HelpSpec(prog, summary, {**config_nodes(), **(nodes or {})}, {"policy": lambda name: policy_class(name).Params})


@dataclass(frozen=True)
class SimulateKeys:
    """The top level of `conf/simulate.yaml` as the user types it, typed by `planner.configs.build`
    (unknown, missing and wrongly typed keys); `SimulateConfig.from_mapping` turns it into the run.
    The defaults live in `conf/simulate.yaml`, so every key is required here.

    Attributes:
        policy: the `policy=` group: `name` plus the policy's native parameters (`???`: not given).
        max_staleness: η; null = unbounded.
        batch_groups: B: groups per optimizer step.
        group_size: n: trajectories per group.
        steps: S: trainer steps to simulate.
        seed: the simulator's random streams (lengths, faults).
        workload: the `workload=` group: `name` plus its parameters.
        sim: the `sim=` group: the simulated cluster.
        calibration: a planner.calibrate output whose `sim:` keys go over the sim group's file and
            under command-line sim.* overrides; null = none.
    """

    policy: dict[str, Any]
    max_staleness: int | None
    batch_groups: int
    group_size: int
    steps: int
    seed: int
    workload: dict[str, Any]
    sim: SimConfig
    calibration: str | None


@dataclass(frozen=True)
class SimulateConfig:
    """One simulation as `conf/simulate.yaml` composes it, typed and checked.

    Attributes:
      policy: the registered policy's name.
      policy_params: native parameters the config sets (`???`: not given, the policy's default)
      ctx: η, B, n and the steps, as every policy sees them.
      seed: the simulator's random streams (lengths, faults).
      workload: the `workload=` group (its `name` and its Params' keys).
      sim: the simulated cluster.
    """

    policy: str
    policy_params: dict[str, Any]
    ctx: PlanContext
    seed: int
    workload: dict[str, Any]
    sim: SimConfig

    @classmethod
    def from_mapping(cls, cfg: Mapping[str, Any], sim_overrides: Mapping[str, Any] | None = None) -> SimulateConfig:
        """`sim_overrides`: the `sim` keys the command line set itself, which win over `calibration`."""
        keys = build(SimulateKeys, with_calibration(cfg, sim_overrides), "")
        policy = dict(keys.policy)
        name = policy.pop("name", None)
        policy_class(name)  # unknown name -> "policy=X: unknown policy (known: ...)"
        ctx = PlanContext(batch_groups=keys.batch_groups, group_size=keys.group_size,
                          max_staleness=keys.max_staleness, total_steps=keys.steps)
        config = cls(name, given_params(policy), ctx, keys.seed, dict(keys.workload), keys.sim)
        config.build_policy()  # validate native parameters now, not mid-sweep
        config.build_workload()
        return config

    def build_policy(self) -> Any:
        return make_policy(self.policy, self.ctx, self.policy_params)

    def build_workload(self) -> Workload:
        return make_workload(self.workload, self.ctx.group_size)


def load_calibration(path: Any) -> dict[str, Any]:
    """The `sim:` mapping of a calibration file; a one-line ValueError naming the file otherwise."""
    check(isinstance(path, str) and bool(path), "calibration", path, "must be a file path (planner.calibrate's output)")
    try:
        obj = yaml.safe_load(Path(path).read_text())
    except OSError as e:
        raise ValueError(f"calibration={path}: cannot read it ({e.strerror})") from None
    except yaml.YAMLError as e:
        raise ValueError(f"calibration={path}: not valid YAML ({str(e).splitlines()[0]})") from None
    if not isinstance(obj, dict) or not isinstance(obj.get("sim"), dict):
        raise ValueError(f"calibration={path}: needs a `sim:` mapping of sim.* keys (python -m planner.calibrate RUN_DIR)")
    check_keys(obj, CALIBRATION_KEYS, f"calibration={path}:")
    return obj["sim"]


def calibration_mismatch(path: str, config: SimulateConfig) -> str | None:
    """A one-line warning when the run's planner context differs from the calibrated run's (the
    file's `run:` mapping), naming each key: a replay without them runs the simulator's defaults."""
    run = (yaml.safe_load(Path(path).read_text()) or {}).get("run") or {}
    ours = {"policy": config.policy, "max_staleness": config.ctx.max_staleness,
            "batch_groups": config.ctx.batch_groups, "group_size": config.ctx.group_size,
            "steps": config.ctx.total_steps}
    differ = [f"{k}={ours[k]} (the run's {run[k]})" for k in ours if k in run and run[k] != ours[k]]
    if not differ:
        return None
    replay = f"; to replay the run: {run['replay']}" if run.get("replay") else ""
    return f"calibration={path} was fitted to another run: {', '.join(differ)}{replay}"


def merge(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """`base` with `over`'s keys on top, nested mappings merged key by key."""
    out = dict(base)
    for key, value in over.items():
        out[key] = merge(out[key], value) if isinstance(value, Mapping) and isinstance(out.get(key), Mapping) else value
    return out


def with_calibration(cfg: Mapping[str, Any], sim_overrides: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """`cfg` with its `calibration` file applied: over the `sim=` file's values, under the `sim` keys
    the command line set itself (`sim_overrides`); `calibration` is then null, so that a caller
    that changes `sim` keys afterwards (planner.tune's candidates) keeps its own values."""
    cfg = dict(cfg)
    if cfg.get("calibration") is not None:
        cfg["sim"] = merge(merge(cfg["sim"], load_calibration(cfg["calibration"])), sim_overrides or {})
    cfg["calibration"] = None
    return cfg


def sim_overrides(overrides: Sequence[str]) -> dict[str, Any]:
    """The `sim.*` keys among Hydra's command-line overrides, as a nested mapping."""
    from omegaconf import OmegaConf

    mine = [o.lstrip("+") for o in overrides if o.lstrip("+").startswith("sim.") and "=" in o]
    return OmegaConf.to_container(OmegaConf.from_dotlist(mine)).get("sim", {}) if mine else {}


def run_simulation(
    config: SimulateConfig, out_dir: str | Path | None, *, plots: bool = True, recorder: EventRecorder | None = None
) -> SimResult:
    """Run one simulation; with `out_dir`, write the contract files (and plots) there."""
    policy, workload = config.build_policy(), config.build_workload()
    ledger = LedgerWriter(Path(out_dir) / LEDGER_FILE) if out_dir is not None else None
    try:
        sim = Simulator(policy, config.ctx, workload, config.sim, seed=config.seed, ledger=ledger, recorder=recorder)
        result = sim.run()
    finally:
        if ledger is not None:
            ledger.close()
    if out_dir is not None:
        write_outputs(out_dir, result.summary, result.steps)
        if plots:
            from planner.tools import plots as P

            P.staleness_histogram(result.summary, Path(out_dir) / "staleness_hist.png")
            P.utilisation(result.steps, Path(out_dir) / "utilisation.png", title=f"{config.policy}, η={config.ctx.max_staleness}")
    return result


def one_line(summary: Mapping[str, Any]) -> str:
    steady = summary.get("steps_per_hour_steady")
    return (
        f"{summary['policy']} η={summary['max_staleness']}: {summary['steps']} steps in {summary['elapsed_s']:.0f} s "
        f"simulated ({summary['steps_per_hour']:.1f} steps/h"
        + (f", {steady:.1f} in the steady state" if steady is not None else "")
        + f"), max staleness {summary['max_token_staleness']}, "
        f"{summary['groups_dropped']} dropped, {summary['tokens_wasted']} tokens wasted, "
        f"trainer busy {summary['trainer_busy_fraction']:.0%}, generators busy {summary['generator_busy_fraction']:.0%}"
        + (", DEADLOCK" if summary.get("deadlock") else "")
    )


def _app(cfg: Any) -> None:
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import OmegaConf

    try:
        config = SimulateConfig.from_mapping(OmegaConf.to_container(cfg, resolve=True),
                                             sim_overrides(HydraConfig.get().overrides.task))
    except ValueError as e:
        fail(e)
    if cfg.calibration is not None and (warning := calibration_mismatch(cfg.calibration, config)):
        print(f"warning: {warning}", file=sys.stderr)
    warnings = config.sim.workers.idle_keys()
    if WORKLOADS[config.workload["name"]].episodic:
        warnings += idle_keys(config.sim)
    for warning in warnings:
        print(f"warning: {warning}", file=sys.stderr)
    out_dir = HydraConfig.get().runtime.output_dir
    result = run_simulation(config, out_dir)
    print(one_line(result.summary))
    print(f"wrote {out_dir}")
    if result.deadlock:
        sys.exit(2)


COMMAND = Command(CONF_DIR, "simulate", help_spec("python -m planner.simulate", __doc__.splitlines()[0].split(": ", 1)[1]),
                  register_config_nodes, lambda cfg, overrides: SimulateConfig.from_mapping(cfg, sim_overrides(overrides)))


def main() -> None:
    hydra_main(COMMAND, _app)


if __name__ == "__main__":
    main()
