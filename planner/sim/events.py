"""The event queue: a heap of `(time, kind, seq, payload)` (vidur's loop without its globals).

`kind` is an IntEnum, so simultaneous events run in a fixed order (a fault before the sync that
would have finished at the same instant, completions before the trainer's step end); `seq`, owned
by this queue instance, keeps insertion order among equal `(time, kind)` and makes runs
deterministic. Payloads are never compared.
"""

from __future__ import annotations

import enum
from heapq import heappop, heappush
from typing import Any


class EventKind(enum.IntEnum):
    FAULT = 0  # payload: worker index
    RESTART = 1  # payload: worker index
    SYNC_DONE = 2  # payload: (worker, version, life)
    COMPLETION = 3  # payload: (worker, epoch): the worker's earliest sequence finishes
    STEP_DONE = 4  # payload: step
    STALL = 5  # payload: (uid, worker, run token): the stall timeout of a hung attempt expires
    LOAD = 6  # payload: (worker, version, life): the worker starts loading a published version (load_lag)
    ENV = 7  # payload: (uid, sample, attempt): a multi-turn sample's environment step ends


Event = tuple[float, EventKind, Any]


class EventQueue:
    def __init__(self) -> None:
        self._heap: list[tuple[float, int, int, Any]] = []
        self._seq = 0
        self.popped = 0

    def push(self, time: float, kind: EventKind, payload: Any) -> None:
        heappush(self._heap, (time, kind, self._seq, payload))
        self._seq += 1

    def pop(self) -> tuple[float, EventKind, Any]:
        time, kind, _, payload = heappop(self._heap)
        self.popped += 1
        return time, kind, payload

    def __len__(self) -> int:
        return len(self._heap)
