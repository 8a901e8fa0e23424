"""The tail's two decisions in the simulator: critical marks and straggler migrations.

The simulator's twin of jaxrl_async/runtime/tail.py. The event loop (planner/sim/simulator.py)
hands `Decision.critical` and `Decision.migrate` (docs/design.md §2.14) to `SimTail`, which
decides what each does to the workers; the loop keeps the order of events — the policy's
`on_tokens` for a moved prefix, the ledger's `migrate` line, rescheduling the workers' next
completions.

- A critical mark (`sim.workers.speculation.when=critical`): the group speculates from then on
  (`Worker.make_fast`; the model is in planner/sim/workers.py and config.py), on every worker it
  runs on in this attempt — a queued group once it starts. when=always speculates every run and
  ignores the marks; when=never ignores them too.
- A migration moves a running group to the least loaded other live worker — load = sequences
  decoding or hung, per unit of speed, counting the group itself on the target — only when that
  is strictly less than the source's, the target has the slots and KV to start it now, and it
  holds weights at least the group's start barrier and the source's version (so a migrated
  group's new tokens are never older than its earlier ones: its window [a(g), d(g)] holds as on
  the source) — under sync_mode=pinned, it holds the very version the group is pinned to, on which
  the group continues (one version per sequence, as on the source). The source books the prefix (abort); the target pays `sim.workers.migration_s`
  plus a re-prefill of prompt + prefix (`prefill_per_token`), both as a stall of its decoding (a
  simplification: a real transfer would delay only the group), and starts the group at once,
  ahead of its queue (the policy names only groups the trainer waits for).

A multi-turn group (planner/sim/episodes.py) is marked and moved turn by turn: a mark makes its
turns in flight and its later turns speculate, a migration moves each of its running turns; the
environment steps between its turns are left alone — no engine time shortens them.

Neither adds a random draw; with speculation never and no migrate decisions, runs are as without
this module.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from planner.sim.config import WorkerConfig
from planner.sim.group import SimGroup
from planner.sim.tail_log import TailLog
from planner.sim.workers import Worker
from planner.types import GroupState


class SimTail:
    """What a critical mark and a migration do to the simulated workers, and their counts."""

    def __init__(self, cfg: WorkerConfig, workers: list[Worker], log: TailLog) -> None:
        self.speculation = cfg.speculation
        self.migration_s = cfg.migration_s
        self.workers = workers
        self.log = log  # the tail analysis's record: a move splits a group's run in two
        self.marked = 0  # groups made to speculate by Decision.critical (when=critical)
        self.migrations = 0  # groups moved by Decision.migrate

    # ------------------------------------------------------------------ critical marks
    def mark(self, now: float, g: SimGroup) -> Worker | None:
        """Group `g` is critical: it speculates from `now` on (when=critical). Returns the worker
        whose rates changed (its next completion must be recomputed), or None."""
        if self.speculation.when != "critical":
            return None  # never: no worker speculates; always: every run already does
        g.critical = True  # a queued group speculates once it starts
        self.marked += 1
        if g.state == GroupState.RUNNING and self.workers[g.worker].make_fast(now, g):
            return self.workers[g.worker]
        return None

    def mark_turns(self, now: float, g: SimGroup, runs: list[SimGroup]) -> list[Worker]:
        """Multi-turn group `g` is critical: its turn runs in flight speculate from `now` on and
        its later turns from their start (its environment steps are not the engine's to speed
        up). Returns the workers whose rates changed."""
        if self.speculation.when != "critical":
            return []
        g.critical = True  # its later turns inherit the mark (planner/sim/episodes.py)
        self.marked += 1
        changed = []
        for run in runs:
            run.critical = True
            if run.state == GroupState.RUNNING and self.workers[run.worker].make_fast(now, run):
                changed.append(self.workers[run.worker])
        return changed

    # ------------------------------------------------------------------ migrations
    def leave(self, now: float, g: SimGroup) -> tuple[Worker, Worker, int] | None:
        """Group `g` leaves its worker for a better one, if it is running and one exists: (source,
        target, the prefix's tokens the source booked to its version); None: it stays."""
        if g.state != GroupState.RUNNING or g.stuck or not g.remaining:
            return None  # queued (the router already chose), hung, or done at this instant
        src = self.workers[g.worker]
        dst = self.target(src, g)
        if dst is None:
            return None
        return src, dst, src.abort(now, g)

    def arrive(self, now: float, g: SimGroup, src: Worker, dst: Worker) -> None:
        """Group `g`, which left `src`, starts on `dst` after the transfer and its re-prefill."""
        self.migrations += 1
        rem = [length - done for length, done in zip(g.lengths, g.done_tok)]
        self.log.migrated(g.uid, now, src.stalled_by(now), dst.index, dst.stalled_by(now))
        dst.advance(now)
        dst.stall(now, self.migration_s)
        g.worker = dst.index
        dst._start(now, g, rem, sum(1 for r in rem if r > 0), g.prompt_tokens + sum(g.lengths),
                   version=g.version if dst.pinned else None)

    def target(self, src: Worker, g: SimGroup) -> Worker | None:
        """The least loaded other live worker that can start `g` now on weights at least its own
        (pinned: that holds the version `g` is pinned to), if strictly less loaded with `g` than
        `src` is; else None (the module docstring)."""
        n = g.remaining
        floor = max(g.min_version, src.version)
        best, best_load = None, (src.active + src.stuck) / src.speed
        for w in self.workers:
            if w is src or not w.alive or w.pending_version is not None:
                continue
            if (g.version not in w.resident_versions()) if w.pinned else w.version < floor:
                continue
            held = w.active + w.stuck
            if held + n > w.max_seqs or w.kv_used + g.prompt_tokens + sum(g.lengths) > w.kv_cap:
                continue
            load = (held + n) / w.speed
            if load < best_load:
                best, best_load = w, load
        return best

    # ------------------------------------------------------------------ summary
    def summary(self) -> dict[str, Any]:
        """The tail's summary keys, only where speculation or migration is on (older summaries
        stay as they are)."""
        out: dict[str, Any] = {}
        if self.speculation.when != "never":
            out["speculation"] = {**dataclasses.asdict(self.speculation), "groups_marked": self.marked}
        if self.migrations:
            out["groups_migrated"] = self.migrations
        return out
