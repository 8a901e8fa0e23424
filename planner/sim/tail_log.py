"""The simulator's timing record of each group, for the tail analysis (planner/tail_analysis.py).

The simulator calls these hooks at the instants it already handles (admission, a run's start and
end, a weight load, a batch); `groups()` turns them into `GroupTimes` with the simulator's exact
seconds: a worker's stalled seconds so far (`Worker.stalled_by`: prefills, weight loads, the
compile) read at a run's start and end give the seconds its counter stood still meanwhile, so

    decode_s  = run − stalled        (the decode steps it took, at the step cost it saw)
    load_s    = the weight loads of its worker that overlap the run
    prefill_s = stalled − load_s     (its own prefill and those of groups that started beside it)

Only each group's last attempt is kept (a fault's lost attempt is regeneration, not tail). A
migrated group's attempt is two runs or more: `migrated` closes the run on the source and opens
one on the target, and the group's seconds are their sums (the target's transfer stall and
re-prefill land in `prefill_s`). A group that finished on another worker than its run's, without
`migrated`, has no trustworthy record and is left out rather than guessed.
Recording reads no random stream and changes no decision: a run is the same with it.
"""

from __future__ import annotations

from collections import defaultdict

from planner.tail_analysis import GroupTimes, loaded_s


class TailLog:
    def __init__(self) -> None:
        self._admit: dict[int, float] = {}
        self._run: dict[int, tuple[int, float, float]] = {}  # uid -> (worker, start, stalled at start) of its run
        self._steps: dict[int, int] = {}  # uid -> decode steps its attempt needs (its longest sample's rest)
        self._before: dict[int, list[tuple[int, float, float, float]]] = {}  # uid -> its earlier runs of the attempt
        self._done: dict[int, tuple[int, float, float, int, list[tuple[int, float, float, float]]]] = {}
        # uid -> (worker, attempt start, end, steps, runs (worker, start, end, stalled))
        self._loads: dict[int, list[tuple[float, float]]] = defaultdict(list)
        self._step: dict[int, int] = {}

    def admitted(self, uid: int, now: float) -> None:
        self._admit[uid] = now

    def started(self, uid: int, worker: int, now: float, stalled: float, steps: int) -> None:
        self._run[uid] = (worker, now, stalled)
        self._steps[uid] = steps
        self._before[uid] = []
        self._done.pop(uid, None)

    def migrated(self, uid: int, now: float, stalled: float, worker: int, worker_stalled: float) -> None:
        """`uid` left its run's worker (stalled `stalled` s so far) for `worker` (`worker_stalled`)."""
        run = self._run.get(uid)
        if run is not None:
            src, start, stalled0 = run
            self._before[uid].append((src, start, now, stalled - stalled0))
            self._run[uid] = (worker, now, worker_stalled)

    def finished(self, uid: int, worker: int, now: float, stalled: float) -> None:
        run = self._run.get(uid)
        if run is not None and run[0] == worker:
            _, start, stalled0 = run
            runs = [*self._before[uid], (worker, start, now, stalled - stalled0)]
            self._done[uid] = (worker, runs[0][1], now, self._steps[uid], runs)
        elif run is not None:
            self._run.pop(uid)  # moved without `migrated`: left out

    def loaded(self, worker: int, start: float, end: float) -> None:
        self._loads[worker].append((start, end))

    def trained(self, step: int, uids: list[int]) -> None:
        for uid in uids:
            self._step[uid] = step

    def groups(self) -> list[GroupTimes]:
        ends = {w: [b for _, b in v] for w, v in self._loads.items()}  # loads come in time order
        out = []
        for uid, step in self._step.items():
            done = self._done.get(uid)
            if done is None:
                continue
            worker, start, end, steps, runs = done
            decode = load = prefill = 0.0
            for w, a, b, stalled in runs:
                loaded = min(loaded_s(self._loads.get(w, []), ends.get(w, []), a, b), stalled)
                decode += max(0.0, b - a - stalled)
                load += loaded
                prefill += stalled - loaded
            out.append(GroupTimes(uid, step, worker, self._admit[uid], start, end, steps, decode, load, prefill))
        return out
