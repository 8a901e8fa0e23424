"""The simulator's timing record of each group, for the tail analysis (planner/tools/tail.py).

The simulator calls these hooks at the instants it already handles (admission, a run's start and
end, a weight load, a batch); `groups()` turns them into `GroupTimes` with the simulator's exact
seconds: a worker's stalled seconds so far (`Worker.stalled_by`: prefills, weight loads, the
compile) read at a run's start and end give the seconds its counter stood still meanwhile, so

    decode_s  = run − stalled        (the decode steps it took, at the step cost it saw)
    load_s    = the weight loads of its worker that overlap the run
    prefill_s = stalled − load_s     (its own prefill and those of groups that started beside it)

Only each group's last attempt is kept (a fault's lost attempt is regeneration, not tail).
Recording reads no random stream and changes no decision: a run is the same with it.
"""

from __future__ import annotations

from collections import defaultdict

from planner.tools.tail import GroupTimes, loaded_s


class TailLog:
    def __init__(self) -> None:
        self._admit: dict[int, float] = {}
        self._run: dict[int, tuple[int, float, float]] = {}  # uid -> (worker, start, stalled at start)
        self._done: dict[int, tuple[int, float, float, float, int]] = {}  # uid -> (worker, start, end, stalled, steps)
        self._loads: dict[int, list[tuple[float, float]]] = defaultdict(list)
        self._step: dict[int, int] = {}

    def admitted(self, uid: int, now: float) -> None:
        self._admit[uid] = now

    def started(self, uid: int, worker: int, now: float, stalled: float) -> None:
        self._run[uid] = (worker, now, stalled)
        self._done.pop(uid, None)

    def finished(self, uid: int, now: float, stalled: float, steps: int) -> None:
        run = self._run.get(uid)
        if run is not None:
            worker, start, stalled0 = run
            self._done[uid] = (worker, start, now, stalled - stalled0, steps)

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
            worker, start, end, stalled, steps = done
            load = min(loaded_s(self._loads.get(worker, []), ends.get(worker, []), start, end), stalled)
            out.append(GroupTimes(uid, step, worker, self._admit[uid], start, end, steps,
                                  max(0.0, end - start - stalled), load, stalled - load))
        return out
