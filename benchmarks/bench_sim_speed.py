"""Simulator speed: simulated trajectories per wall second, policies side by side in one run.

    python benchmarks/bench_sim_speed.py [--trajectories 1000000] [--policies nemo_ready_first,nemo_in_order]

Target (docs/design.md §4, "people run it in loops"): 1,000,000 trajectories in <= 60 s on one core.
B=64 groups of n=16 per step, lognormal workload, 8 workers, no ledger file (the ledger costs
~10-20%: pass --ledger DIR to include it).
"""

from __future__ import annotations

import argparse
import time

import planner.policies  # noqa: F401  (registers the baselines)
import planner.policies.lookahead  # noqa: F401
from planner.ledger import LedgerWriter
from planner.registry import make_policy
from planner.sim import SimConfig, Simulator, WorkerConfig, make_workload
from planner.types import PlanContext


def bench(policy: str, trajectories: int, eta: int, ledger_dir: str | None) -> tuple[float, int]:
    B, n = 64, 16
    ctx = PlanContext(batch_groups=B, group_size=n, max_staleness=eta, total_steps=max(1, trajectories // (B * n)))
    cfg = SimConfig(workers=WorkerConfig(num_workers=8, max_concurrency=512))
    ledger = LedgerWriter(f"{ledger_dir}/{policy}.jsonl") if ledger_dir else None
    sim = Simulator(make_policy(policy, ctx), ctx, make_workload({"name": "lognormal"}, n), cfg, seed=0, ledger=ledger)
    t0 = time.perf_counter()
    result = sim.run()
    wall = time.perf_counter() - t0
    if ledger:
        ledger.close()
    return wall, result.summary["trajectories_trained"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trajectories", type=int, default=1_000_000)
    ap.add_argument("--policies", default="nemo_ready_first,nemo_in_order,lookahead")
    ap.add_argument("--eta", type=int, default=2)
    ap.add_argument("--ledger", default=None)
    args = ap.parse_args()
    for policy in args.policies.split(","):
        wall, trajs = bench(policy, args.trajectories, args.eta, args.ledger)
        print(f"{policy:18s} {trajs:>9d} trajectories in {wall:6.1f} s = {trajs / wall:>9,.0f} trajectories/s")


if __name__ == "__main__":
    main()
