"""Where the tail's time goes: per group and per step, from a run's timing record (docs/tail_analysis.md).

    tail(groups, steps)          # the `tail` dict of summary.json, from the records below
    episode_split(events)        # multi-turn episodes: generation / environment / waiting
    from_run_dir(run_dir)        # a real run: trace.jsonl + ledger.jsonl + metrics.jsonl -> tail dict

The simulator (its summary's `tail`), the training run's summary (jaxrl_async/job/report.py) and
the command `python -m planner.tail RUN_DIR` (planner/tools/tail.py: units and a verdict) read it.

A strict no-drop policy trains step k only when the groups it needs are done, so the trainer's
wait is set by the last group of each batch to finish: the step's *critical group*. This module
splits each trained group's life into

    queue_s     admitted -> generation began on its worker (real runs: first token streamed, so
                its own prefill is in here; the trace cannot tell them apart)
    prefill_s   seconds its worker spent prefilling while it ran (its prompt and the prompts that
                started beside it); None where the trace cannot tell (real runs)
    load_s      seconds its worker spent loading weights while it ran
    decode_s    decode steps it needed (its longest sample) × the step cost it saw
    other_s     the rest of its run (finish − start − the three above; real runs: the prefills)
    trainer_s   finish -> its batch was handed to the trainer (the group waits for the trainer)

and each step's trainer wait, [ready, handed] (`metrics.jsonl` `start_s − wait_s`, `start_s`),
between the groups of its batch. The figures (`tail`'s keys, each documented in `FIGURES`) say
whether the straggler binds: how much of the trainer's wait would vanish if the slowest 5% of
each batch had finished with the rest, and how slow a critical group's tokens are compared with
the others'.

Multi-turn episodes (a trace with `episode` lines, planner/run_trace.py) add a section of their
own, `episodes` (`episode_split`): each episode's time split into *generation* (its turns on an
engine), *environment* (the environment steps between and after them, which no engine time can
speed up) and *waiting* (queued for an engine slot before each turn): totals, shares, and p50/p95
per turn. A run without episode lines has no such key.

The simulator feeds `GroupTimes` from its own clock (planner/sim/tail_log.py: exact stall and
decode seconds); a real run's come from its trace, where a group's step cost is the mean s/step
of its worker's `decode` lines drained while it ran (the trace aggregates iterations between
step ends; it holds no per-sequence step). Nothing here is a model of what did not happen.
"""

from __future__ import annotations

import json
import math
from bisect import bisect_left, bisect_right
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from planner.ledger import LEDGER_FILE, read_ledger
from planner.run_files import METRICS_FILE
from planner.run_trace import TRACE_FILE, read_run_trace

TAIL_SHARE = 0.05  # "the last 5% of groups" of each batch
FIGURES = {
    "groups": "trained groups with a full timing record",
    "steps": "steps whose batch is among them",
    "trainer_wait_s": "seconds the trainer waited for batches (sum over steps)",
    "trainer_wait_fraction": "trainer_wait_s over the last step's end",
    "steps_bound_by_generation": "fraction of steps whose critical group finished after the trainer was ready",
    "wait_share_last_5pct": "share of trainer_wait_s that would vanish if the last 5% of each batch's groups "
                            "(at least one) had finished when the batch's other groups had",
    "wait_share_last_group": "the same for the one last group of each batch (the critical group alone)",
    "critical_length_rank": "median over steps of the critical group's decode steps as a quantile of its batch's "
                            "(1 = the batch's longest)",
    "critical_is_longest": "fraction of steps whose critical group needed the most decode steps of its batch",
    "decode_s_per_token": "decode_s / decode steps, p50 and p99, critical groups vs the others",
    "mean_s": "mean seconds of each phase, critical groups vs the others",
    "update_load_s": "worker-seconds spent swapping in new weights (each load's t_sync; none under sync_mode=pinned)",
    "update_held_s": "worker-seconds new starts were held for a pending weight update (drain: until in-flight samples "
                     "finished; pinned: until a resident version freed); None where the record cannot tell (real runs)",
}
PHASES = ("queue_s", "prefill_s", "load_s", "decode_s", "other_s", "trainer_s")
# An episode turn's three parts, in the order of an `episode` line's [queued_s, gen_s, env_s].
EPISODE_PARTS = ("waiting", "generation", "environment")


@dataclass(frozen=True)
class GroupTimes:
    """One trained group's last generation attempt, in run seconds."""

    uid: int
    step: int  # the step that trained it
    worker: int
    admit_s: float
    start_s: float
    finish_s: float
    decode_steps: int  # decode steps its last attempt needed: its longest sample's remaining tokens
    decode_s: float
    load_s: float
    prefill_s: float | None  # None: the record cannot tell (see the module docstring)

    def phases(self, handed_s: float) -> dict[str, float | None]:
        run = self.finish_s - self.start_s
        other = run - self.decode_s - self.load_s - (self.prefill_s or 0.0)
        return {"queue_s": self.start_s - self.admit_s, "prefill_s": self.prefill_s, "load_s": self.load_s,
                "decode_s": self.decode_s, "other_s": other if other > 1e-9 else 0.0, "trainer_s": max(0.0, handed_s - self.finish_s)}


@dataclass(frozen=True)
class StepTimes:
    """A trainer step's wait: it was ready for batch `step` at `ready_s` and got it at `handed_s`."""

    step: int
    ready_s: float
    handed_s: float
    end_s: float


def steps_from_metrics(rows: Iterable[Mapping[str, Any]]) -> list[StepTimes]:
    """Step waits from `metrics.jsonl` records (both drivers write `wait_s`, `start_s`, `end_s`)."""
    return [StepTimes(int(r["step"]), float(r["start_s"]) - float(r["wait_s"]), float(r["start_s"]), float(r["end_s"]))
            for r in rows]


def _quantiles(values: Sequence[float]) -> dict[str, float | None]:
    if not values:
        return {"p50": None, "p99": None}
    q = np.percentile(np.asarray(values, float), [50, 99])
    return {"p50": float(q[0]), "p99": float(q[1])}


def _mean(values: Sequence[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return float(np.mean(known)) if known else None


def _caused(finishes: Sequence[float], ready: float, wait: float, m: int) -> float:
    """Seconds of a step's wait after the batch's groups but its last `m` were done: what the
    last `m` cost the trainer. `finishes` ascending."""
    if wait <= 0 or not finishes:
        return 0.0
    cut = finishes[-m - 1] if len(finishes) > m else -math.inf
    return min(wait, max(0.0, finishes[-1] - max(ready, cut)))


def critical_groups(groups: Iterable[GroupTimes]) -> dict[int, GroupTimes]:
    """Step -> its critical group: the batch's group that finished last (the lowest uid on a tie)."""
    out: dict[int, GroupTimes] = {}
    for g in groups:
        c = out.get(g.step)
        if c is None or (g.finish_s, -g.uid) > (c.finish_s, -c.uid):
            out[g.step] = g
    return out


def tail(groups: Sequence[GroupTimes], steps: Sequence[StepTimes], *, update_load_s: float | None = None,
         update_held_s: float | None = None) -> dict[str, Any]:
    """The `tail` figures (`FIGURES`) of `groups` (trained ones) and the run's `steps`; the two
    weight-update figures are the run's totals over workers, where its record has them: what a
    swap and a drain cost every group behind them, and what version pinning removes."""
    by_step: dict[int, list[GroupTimes]] = defaultdict(list)
    for g in groups:
        by_step[g.step].append(g)
    steps = [s for s in steps if s.step in by_step]
    critical = critical_groups(groups)
    handed = {s.step: s.handed_s for s in steps}
    wait = caused5 = caused1 = 0.0
    bound = 0
    ranks, longest = [], 0
    for s in steps:
        batch = by_step[s.step]
        finishes = sorted(g.finish_s for g in batch)
        w = max(0.0, s.handed_s - s.ready_s)
        wait += w
        caused5 += _caused(finishes, s.ready_s, w, max(1, round(TAIL_SHARE * len(batch))))
        caused1 += _caused(finishes, s.ready_s, w, 1)
        c = critical[s.step]
        bound += c.finish_s > s.ready_s
        lengths = [g.decode_steps for g in batch]
        ranks.append(sum(x <= c.decode_steps for x in lengths) / len(lengths))
        longest += c.decode_steps >= max(lengths)
    crit_uids = {c.uid for c in critical.values()}
    kinds = {"critical": [g for g in groups if g.uid in crit_uids and g.step in handed],
             "other": [g for g in groups if g.uid not in crit_uids and g.step in handed]}
    per_token = {k: _quantiles([g.decode_s / g.decode_steps for g in v if g.decode_steps]) for k, v in kinds.items()}
    mean_s = {}
    for k, v in kinds.items():
        rows = [g.phases(handed[g.step]) for g in v]
        mean_s[k] = {p: _mean([r[p] for r in rows]) for p in PHASES}
    end = max((s.end_s for s in steps), default=0.0)
    n = len(steps)
    return {
        "groups": sum(len(v) for v in kinds.values()),
        "steps": n,
        "trainer_wait_s": wait,
        "trainer_wait_fraction": wait / end if end > 0 else None,
        "steps_bound_by_generation": bound / n if n else None,
        "wait_share_last_5pct": caused5 / wait if wait > 0 else None,
        "wait_share_last_group": caused1 / wait if wait > 0 else None,
        "critical_length_rank": float(np.median(ranks)) if ranks else None,
        "critical_is_longest": longest / n if n else None,
        "decode_s_per_token": per_token,
        "mean_s": mean_s,
        "update_load_s": update_load_s,
        "update_held_s": update_held_s,
    }


# ---------------------------------------------------------------- a real run's files
def _overlap(a0: float, a1: float, b0: float, b1: float) -> float:
    return max(0.0, min(a1, b1) - max(a0, b0))


def loaded_s(loads: Sequence[tuple[float, float]], ends: Sequence[float], t0: float, t1: float) -> float:
    """Seconds of `loads` ((start, end), in time order, not overlapping: one worker loads one
    version at a time; `ends` their ends) inside [t0, t1]: a bisection finds the first."""
    total = 0.0
    for a, b in loads[bisect_right(ends, t0):]:
        if a >= t1:
            break
        total += _overlap(t0, t1, a, b)
    return total


def groups_from_trace(events: Sequence[Mapping[str, Any]], trained: Mapping[int, int]) -> list[GroupTimes]:
    """`GroupTimes` of every trained group (`trained`: uid -> step, from the ledger) whose last
    attempt the trace saw admitted, started and finished. A group's step cost is the mean s/step
    of its worker's timed `decode` lines drained from its start until the first drain after its
    finish (the lines of that window hold its iterations); compiling iterations are left out."""
    admit, start, finish = {}, {}, {}
    loads: dict[int, list[tuple[float, float]]] = defaultdict(list)
    drains: dict[int, list[tuple[float, int, float]]] = defaultdict(list)  # worker -> (t, steps, s)
    for e in events:
        kind = e["event"]
        if kind == "admit":
            admit[e["uid"]] = e
        elif kind == "start":
            start[e["uid"]] = e
        elif kind == "finish":
            finish[e["uid"]] = e
        elif kind == "load":
            loads[e["worker"]].append((e["t"], e["t"] + e["s"]))
        elif kind == "decode" and not e.get("compile") and e["steps"]:
            drains[e["worker"]].append((e["t"], e["steps"], e["s"]))
    # Per worker, the drains in time order with running sums: a group's window is two bisections.
    sums: dict[int, tuple[list[float], np.ndarray, np.ndarray]] = {}
    for w, lines in drains.items():
        lines.sort()
        sums[w] = ([t for t, _, _ in lines], np.cumsum([0, *(n for _, n, _ in lines)]),
                   np.cumsum([0.0, *(sec for _, _, sec in lines)]))
    for w in loads:
        loads[w].sort()
    load_ends = {w: [b for _, b in v] for w, v in loads.items()}
    out = []
    for uid, step in trained.items():
        a, s, f = admit.get(uid), start.get(uid), finish.get(uid)
        if a is None or s is None or f is None or not (a["attempt"] == s["attempt"] == f["attempt"]):
            continue
        w, t0, t1 = s["worker"], s["t"], f["t"]
        if w not in sums:
            continue  # an engine that times no iterations: no step cost to read
        ts, steps_sum, s_sum = sums[w]
        i, j = bisect_left(ts, t0), min(bisect_left(ts, t1) + 1, len(ts))  # through the first drain at/after t1
        if j <= i:
            continue
        cost = float(s_sum[j] - s_sum[i]) / float(steps_sum[j] - steps_sum[i])
        steps_needed = max(f["lengths"], default=0)
        out.append(GroupTimes(uid, step, w, a["t"], t0, t1, steps_needed, steps_needed * cost,
                              loaded_s(loads.get(w, []), load_ends.get(w, []), t0, t1), None))
    return out


def episode_split(events: Iterable[Mapping[str, Any]]) -> dict[str, Any] | None:
    """Where multi-turn episodes' time goes, from the trace's `episode` lines; None without any.

    `episodes`, `turns`: counted; `faults`: episodes ended by an environment fault, per kind;
    `total_s` / `share`: seconds (and share of all) waiting, generating, in the environment;
    `per_turn_s`: p50 / p95 of each part over turns; `turns_per_episode`: p50 / p95."""
    parts: dict[str, list[float]] = {p: [] for p in EPISODE_PARTS}
    per_episode: list[int] = []
    faults: dict[str, int] = defaultdict(int)
    for e in events:
        if e["event"] != "episode":
            continue
        per_episode.append(len(e["turns"]))
        if e["fault"] is not None:
            faults[str(e["fault"])] += 1
        for turn in e["turns"]:
            for part, seconds in zip(EPISODE_PARTS, turn):
                parts[part].append(float(seconds))
    if not per_episode:
        return None
    totals = {p: float(sum(v)) for p, v in parts.items()}
    whole = sum(totals.values())

    def q(values: Sequence[float]) -> dict[str, float | None]:
        if not values:
            return {"p50": None, "p95": None}
        p50, p95 = np.percentile(np.asarray(values, float), [50, 95])
        return {"p50": float(p50), "p95": float(p95)}

    return {
        "episodes": len(per_episode),
        "turns": sum(per_episode),
        "faults": dict(sorted(faults.items())),
        "total_s": totals,
        "share": {p: (totals[p] / whole if whole > 0 else None) for p in EPISODE_PARTS},
        "per_turn_s": {p: q(v) for p, v in parts.items()},
        "turns_per_episode": q([float(n) for n in per_episode]),
    }


def trained_steps(ledger: Iterable[Mapping[str, Any]]) -> dict[int, int]:
    """uid -> the step that trained it, from the ledger's `train` events."""
    return {g["uid"]: e["step"] for e in ledger if e.get("event") == "train" for g in e["groups"]}


def from_run_dir(run_dir: str | Path) -> dict[str, Any]:
    """The `tail` dict of a real run from its files; ValueError (one line) when one is missing."""
    run_dir = Path(run_dir)
    for name in (TRACE_FILE, LEDGER_FILE, METRICS_FILE):
        if not (run_dir / name).is_file():
            raise ValueError(f"{run_dir}: no {name} (the tail analysis reads a run's trace, ledger and metrics)")
    events = list(read_run_trace(run_dir / TRACE_FILE))
    rows = [json.loads(line) for line in (run_dir / METRICS_FILE).read_text().splitlines() if line.strip()]
    groups = groups_from_trace(events, trained_steps(read_ledger(run_dir / LEDGER_FILE)))
    loads = sum(float(e["s"]) for e in events if e["event"] == "load")
    has_loads = any(e["event"] == "load" for e in events)
    out = tail(groups, steps_from_metrics(rows), update_load_s=loads if has_loads else None)
    split = episode_split(events)
    if split is not None:
        out["episodes"] = split
    return out
