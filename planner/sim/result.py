"""What a simulated run hands back: `SimResult`, its summary and its per-step rows.

The loop (`planner.sim.simulator`) keeps the order of events; this module reads the simulator's
public state at a step's end (`step_row`) and at the run's end (`summarize`) and hands it to
`RunMetrics` (planner/sim/metrics.py), which shapes both files with the runtime's keys. It only
reads: nothing here changes the run, so a run is the same with or without its rows.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from planner.sim.workloads import workload_params
from planner.tail_analysis import episode_split, steps_from_metrics, tail
from planner.types import GroupState

if TYPE_CHECKING:
    from planner.sim.simulator import Simulator


@dataclass
class SimResult:
    summary: dict[str, Any]  # summary.json
    steps: list[dict[str, Any]]  # metrics.jsonl rows
    deadlock: bool


def step_row(sim: Simulator, step: int, info: dict[str, Any]) -> None:
    """Record trainer step `step`'s metrics.jsonl row; `info` is what its hand-over noted
    (`start_s`, `wait_s`, `tokens`, `batch`), the clock is at its STEP_DONE."""
    now, workers = sim.now, sim.workers
    live = [w for w in workers if w.alive]
    duration = now - info["start_s"]
    sim.metrics.step_row(
        step=step, batch=info["batch"], cycle_s=duration + info["wait_s"], wait_s=info["wait_s"],
        start_s=info["start_s"], end_s=now, elapsed_s=now, trainer_busy_s=sim.trainer.busy_total,
        generator_busy_s=sum(w.busy_time(now) for w in workers) / len(workers),
        gen_active=[w.active if w.alive else -1 for w in workers],
        kv_usage=sum(w.kv_used for w in live) / max(1, sum(w.kv_cap for w in live)),
        tokens=info["tokens"], inflight=sum(1 for g in sim.groups.values() if g.state <= GroupState.RUNNING),
    )


def weight_updates(sim: Simulator) -> dict[str, Any]:
    """What weight updates did to the workers: the summary's `weight_updates` (docs/design.md §4)."""
    w = sim.cfg.workers
    out = {"sync_mode": w.sync_mode, "loads": sum(x.loads for x in sim.workers),
           "held_loads": sum(x.update_waits for x in sim.workers)}
    if w.sync_mode == "pinned":
        out["resident_versions"] = w.resident
        out["max_resident"] = max(x.max_resident for x in sim.workers)
    return out


def summarize(sim: Simulator, deadlock: bool, wall_s: float) -> SimResult:
    """The run's `SimResult`: summary.json (docs/design.md §8 keys, then the simulator's), the
    step rows recorded so far and the deadlock flag."""
    now, policy = sim.now, sim.policy
    params = getattr(policy, "params", None)
    workers = sim.workers
    tail_figures = tail(sim.tail_log.groups(), steps_from_metrics(sim.metrics.steps),
                        update_load_s=sum(w.swap_total for w in workers),
                        update_held_s=sum(w.held_total + (now - w.held_since if w.held_since is not None else 0.0)
                                          for w in workers))
    extras = {}
    if sim.workload.episodic:  # multi-turn: what the episodes did, and where their time went
        extras["episodes"] = sim.episodes.summary()
        split = episode_split(sim.episodes.records)
        if split is not None:
            tail_figures["episodes"] = split
    summary = sim.metrics.summary(
        policy=policy.name,
        max_staleness=sim.ctx.max_staleness,
        staleness_bound=policy.staleness_bound(),
        steps=sim.trainer.step,
        groups_admitted=sim.admitted,
        elapsed_s=now,
        trainer_busy_s=sim.trainer.busy_total,
        generator_busy_s=[w.busy_time(now) for w in sim.workers],
        deadlock=deadlock,
        wall_s=wall_s,
        events=sim.queue.popped,
        trainer_wait_s=sim.trainer.wait_total,
        readmissions=sim.readmissions,
        groups_lost=len(sim.lost),
        groups_stalled=sim.stalls,
        policy_params=dataclasses.asdict(params) if dataclasses.is_dataclass(params) else {},
        workload=workload_params(sim.workload),
        seed=sim.seed,
        tail=tail_figures,
        weight_updates=weight_updates(sim),
        **sim.tail.summary(),
        **extras,
    )
    return SimResult(summary, sim.metrics.steps, deadlock)
