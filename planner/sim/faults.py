"""When workers die: a fixed list from the config plus, optionally, a Poisson process per worker.

Random faults draw from their own generator (spawned from the run seed) so that enabling faults
does not change the workload's lengths. After a restart the worker's next random fault is drawn
from the restart time; a worker that never restarts gets no more faults.
"""

from __future__ import annotations

import numpy as np

from planner.sim.config import FaultConfig


class FaultPlan:
    def __init__(self, cfg: FaultConfig, num_workers: int, rng: np.random.Generator) -> None:
        self.cfg = cfg
        self.num_workers = num_workers
        self.rng = rng
        self.rate_per_s = cfg.rate / 3600.0

    def initial(self) -> list[tuple[float, int]]:
        """(time, worker) of the configured faults and of each worker's first random fault."""
        faults = [(e.time, e.worker) for e in self.cfg.events]
        for w in range(self.num_workers):
            nxt = self.next_random(w, 0.0)
            if nxt is not None:
                faults.append(nxt)
        return faults

    def next_random(self, worker: int, since: float) -> tuple[float, int] | None:
        if self.rate_per_s <= 0:
            return None
        return since + float(self.rng.exponential(1.0 / self.rate_per_s)), worker

    @property
    def prefix_kept(self) -> bool:
        return self.cfg.recovery == "resume"
