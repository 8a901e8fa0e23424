"""The data stream as the policy sees it: a window of upcoming prompts (candidates).

Real data loaders hand the trainer prompts in order; a policy may look a little ahead (a
lookahead planner orders long predicted groups first), so the driver shows `policy.admit` the next
`size` prompts. Lengths are drawn in vectorized blocks and kept beside each candidate; the policy
sees them only as `Candidate.oracle_tokens` (the group's longest response), which only an oracle
predictor may read.
"""

from __future__ import annotations

from bisect import bisect_left

import numpy as np

from planner.sim.workloads import Workload
from planner.types import Candidate

BLOCK = 4096  # groups drawn per vectorized call


class AdmissionWindow:
    def __init__(self, workload: Workload, rng: np.random.Generator, size: int) -> None:
        self.workload = workload
        self.rng = rng
        self.size = size
        self.candidates: list[Candidate] = []  # stream order; passed to policy.admit as is
        self._data: dict[int, tuple[int, list[int]]] = {}  # uid -> (prompt tokens, lengths)
        self._next_uid = 0
        self._block: list[tuple[int | str, int, list[int]]] = []
        self._block_pos = 0
        self.refill()

    def _draw(self) -> tuple[int | str, int, list[int]]:
        if self._block_pos == len(self._block):
            d = self.workload.sample(self.rng, BLOCK)
            self._block = list(zip(d.prompt_ids, d.prompt_tokens.tolist(), d.lengths.tolist()))
            self._block_pos = 0
        row = self._block[self._block_pos]
        self._block_pos += 1
        return row

    def refill(self) -> None:
        while len(self.candidates) < self.size:
            prompt_id, prompt_tokens, lengths = self._draw()
            uid = self._next_uid
            self._next_uid += 1
            self.candidates.append(Candidate(uid, prompt_id, prompt_tokens, max(lengths)))
            self._data[uid] = (prompt_tokens, lengths)

    def __contains__(self, uid: int) -> bool:
        return uid in self._data

    def take(self, uid: int) -> tuple[Candidate, int, list[int]]:
        """Remove admitted candidate `uid` from the window and refill it; returns (candidate,
        prompt tokens, lengths). The window is in uid order (stream order), so bisection finds it;
        the list is replaced, not changed, because the policy may still hold the one it was shown."""
        prompt_tokens, lengths = self._data.pop(uid)
        i = bisect_left(self.candidates, uid, key=_uid)
        c = self.candidates[i]
        self.candidates = self.candidates[:i] + self.candidates[i + 1 :]
        self.refill()
        return c, prompt_tokens, lengths


def _uid(c: Candidate) -> int:
    return c.uid
