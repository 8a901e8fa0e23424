"""The data stream as the policy sees it: a window of upcoming prompts (candidates).

Real data loaders hand the trainer prompts in order; a policy may look a little ahead (a
lookahead planner orders long predicted groups first), so the driver shows `policy.admit` the next
`size` prompts. Lengths are drawn in vectorized blocks and kept beside each candidate; the policy
sees them only as `Candidate.oracle_tokens` (the group's longest response), which only an oracle
predictor may read.
"""

from __future__ import annotations

import numpy as np

from planner.sim.workloads import EpisodeDraw, Workload
from planner.types import Candidate

BLOCK = 4096  # groups drawn per vectorized call


class AdmissionWindow:
    def __init__(self, workload: Workload, rng: np.random.Generator, size: int) -> None:
        self.workload = workload
        self.rng = rng
        self.size = size
        self._shown: list[Candidate] = []  # stream order, as `candidates` last returned it
        # uid -> (candidate, prompt tokens, lengths, its samples' episodes or None)
        self._data: dict[int, tuple[Candidate, int, list[int], list[EpisodeDraw] | None]] = {}
        self._taken = False  # admissions since `candidates` was last read
        self._next_uid = 0
        self._block: list[tuple[int | str, int, list[int], list[EpisodeDraw] | None]] = []
        self._block_pos = 0
        self.refill()

    def _draw(self) -> tuple[int | str, int, list[int], list[EpisodeDraw] | None]:
        if self._block_pos == len(self._block):
            d = self.workload.sample(self.rng, BLOCK)
            episodes = d.episodes if d.episodes is not None else [None] * len(d.prompt_ids)
            self._block = list(zip(d.prompt_ids, d.prompt_tokens.tolist(), d.lengths.tolist(), episodes))
            self._block_pos = 0
        row = self._block[self._block_pos]
        self._block_pos += 1
        return row

    def refill(self) -> None:
        while len(self._shown) < self.size:
            prompt_id, prompt_tokens, lengths, episodes = self._draw()
            uid = self._next_uid
            self._next_uid += 1
            c = Candidate(uid, prompt_id, prompt_tokens, max(lengths))
            self._shown.append(c)
            self._data[uid] = (c, prompt_tokens, lengths, episodes)

    @property
    def candidates(self) -> list[Candidate]:
        """The window in stream order, passed to `policy.admit` as is. The candidates taken since
        the last read leave it, and it is refilled, in a new list: the policy may still hold the
        old one. (Only this window draws from its generator, so when it refills changes nothing.)"""
        if self._taken:
            self._taken = False
            self._shown = [c for c in self._shown if c.uid in self._data]
            self.refill()
        return self._shown

    def __contains__(self, uid: int) -> bool:
        return uid in self._data

    def take(self, uid: int) -> tuple[Candidate, int, list[int], list[EpisodeDraw] | None]:
        """Admit candidate `uid`: returns (candidate, prompt tokens, lengths, episodes: its samples'
        `EpisodeDraw`s for a multi-turn workload, else None); it leaves the window."""
        self._taken = True
        return self._data.pop(uid)
