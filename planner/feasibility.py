"""The EDF feasibility condition (F) of docs/design.md §2, on deadline counts.

At trainer step k, with U the admitted untrained groups and B groups per step, the schedule is
feasible when, for every D >= k,

    |{g in U : d(g) <= D}|  <=  B * (D - k + 1)                       (F)

It holds iff every group can be given a step inside its window with exactly B groups a step
(Horn's EDF argument: sort by deadline, fill steps k, k+1, ... B at a time). Deadlines are
integers in a short range [k, k + η], so the check is a prefix sum over a dict: O(η).
"""

from __future__ import annotations

from collections.abc import Mapping


def slack(counts: Mapping[int, int], step: int, batch: int) -> int:
    """min over D >= step of  B·(D − step + 1) − |{d <= D}|  (negative: (F) is violated).

    `counts` maps deadline -> number of untrained groups with that deadline. With no groups the
    slack is B (one step's worth), which is what one more admission at deadline `step` may use.
    """
    worst = batch
    cum = 0
    for d in sorted(counts):
        c = counts[d]
        if c == 0:
            continue
        cum += c
        worst = min(worst, batch * (d - step + 1) - cum)
    return worst


def feasible(counts: Mapping[int, int], step: int, batch: int) -> bool:
    """(F) at `step`: every counted group fits a step in [step, its deadline]."""
    return slack(counts, step, batch) >= 0


def admission_room(counts: Mapping[int, int], step: int, batch: int, deadline: int) -> int:
    """How many more groups with deadline `deadline` keep (F) true at `step`.

    Adding m groups at deadline d raises |{<= D}| by m for every D >= d only, so the room is
    min over D >= d of B·(D − step + 1) − |{<= D}| — and at least the check at D = d itself.
    """
    cum = sum(c for d, c in counts.items() if d <= deadline)
    room = batch * (deadline - step + 1) - cum
    for d in sorted(k for k in counts if k > deadline):
        cum += counts[d]
        room = min(room, batch * (d - step + 1) - cum)
    return room
