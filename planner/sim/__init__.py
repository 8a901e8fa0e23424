"""Discrete-event simulator of an async RL cluster (docs/design.md §4): generation workers with continuous
batching, a trainer, weight syncs, faults and response-length workloads, driving any policy through
the same event protocol as the real runtime.

    from planner.sim import Simulator, SimConfig, make_workload
    result = Simulator(policy, ctx, make_workload({"name": "lognormal"}, n), SimConfig(), seed=0).run()
"""

from planner.sim.config import FaultConfig, FaultSpec, SimConfig, SimTrainerConfig, WorkerConfig
from planner.sim.result import SimResult
from planner.sim.simulator import Simulator
from planner.sim.recorder import EventRecorder, first_divergence, replay
from planner.sim.workloads import WORKLOADS, make_workload

__all__ = [
    "EventRecorder", "FaultConfig", "FaultSpec", "SimConfig", "SimResult", "SimTrainerConfig", "Simulator",
    "WORKLOADS", "WorkerConfig", "first_divergence", "make_workload", "replay",
]
