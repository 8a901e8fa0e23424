"""Assemble the engine's streamed `SampleOutput` pieces into groups.

The engine streams deltas per (request, sample); the runtime needs, per group: when it started
(the first piece, with its first token's version — the planner's `on_group_started`), the tokens
sampled on each version as they arrive (`on_tokens`), and the whole group once all `n` samples
are done (rewards, `on_group_finished`, the batch, the ledger's `versions`).

Request ids are `"<uid>.<attempt>"`: a group regenerated after a fault or a restart is a new
request, so late pieces of its old request (aborted or not) are recognised and ignored.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from jaxrl_async.engines.base import SampleOutput
from planner.types import Versions
from planner.versions import VersionRuns, extend_runs, tokens_by_version


@dataclass
class RolloutSample:
    """One trajectory of a group, as the engine produced it."""

    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)  # behaviour log-prob of each token
    versions: VersionRuns = field(default_factory=list)  # run-length [[version, count], ...]
    finish_reason: str | None = None  # set when the sample is done

    def extend(self, piece: SampleOutput) -> None:
        self.token_ids += piece.token_ids
        self.logprobs += piece.logprobs
        extend_runs(self.versions, piece.versions)
        if piece.done:
            self.finish_reason = piece.finish_reason or "stop"


@dataclass
class GroupRollout:
    """A group's prompt and samples; `rewards` is filled once it is scored."""

    uid: int
    prompt_id: int | str
    prompt_ids: list[int]
    samples: list[RolloutSample]
    attempt: int = 0
    started: bool = False
    rewards: list[float] | None = None
    reward_errors: int = 0

    @property
    def request_id(self) -> str:
        return f"{self.uid}.{self.attempt}"

    @property
    def done(self) -> bool:
        return all(s.finish_reason is not None for s in self.samples)

    @property
    def tokens(self) -> int:
        return sum(len(s.token_ids) for s in self.samples)

    def token_versions(self) -> Versions:
        """Tokens by generation version over all samples, oldest version first (ledger `versions`)."""
        return tokens_by_version(s.versions for s in self.samples)

    def last_versions(self) -> list[int]:
        """Version of each sample's last token (dressage's L3 reads it)."""
        return [s.versions[-1][0] for s in self.samples if s.versions]

    def to_json(self) -> dict[str, Any]:
        return {
            "uid": self.uid, "prompt_id": self.prompt_id, "prompt_ids": self.prompt_ids,
            "attempt": self.attempt, "rewards": self.rewards, "reward_errors": self.reward_errors,
            "samples": [[s.token_ids, s.logprobs, s.versions, s.finish_reason] for s in self.samples],
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> GroupRollout:
        samples = [RolloutSample(list(t), list(lp), [list(v) for v in vs], fr) for t, lp, vs, fr in d["samples"]]
        return cls(d["uid"], d["prompt_id"], list(d["prompt_ids"]), samples, d["attempt"], True,
                   d["rewards"], d["reward_errors"])


@dataclass(frozen=True)
class PieceEvent:
    """What one piece means for the planner."""

    group: GroupRollout
    started_version: int | None  # the group's first token version, on its first piece only
    new_tokens: Versions  # tokens of this piece by version
    group_done: bool  # this piece finished the group's last sample


class RolloutCollector:
    """Live groups by request id; pieces of unknown requests (dropped, superseded) are ignored."""

    def __init__(self) -> None:
        self._by_request: dict[str, GroupRollout] = {}

    def open(self, uid: int, prompt_id: int | str, prompt_ids: list[int], n: int, attempt: int) -> GroupRollout:
        group = GroupRollout(uid, prompt_id, list(prompt_ids), [RolloutSample() for _ in range(n)], attempt)
        self._by_request[group.request_id] = group
        return group

    def close(self, group: GroupRollout) -> None:
        self._by_request.pop(group.request_id, None)

    def __len__(self) -> int:
        return len(self._by_request)

    def is_open(self, request_id: str) -> bool:
        return request_id in self._by_request

    def add(self, piece: SampleOutput) -> PieceEvent | None:
        group = self._by_request.get(piece.request_id)
        if group is None:
            return None
        sample = group.samples[piece.sample_index]
        if sample.finish_reason is not None:
            raise ValueError(f"engine sent a piece for request {piece.request_id!r} sample "
                             f"{piece.sample_index} after its done piece")
        started = None
        if not group.started and piece.versions:
            group.started = True
            started = piece.versions[0][0]
        sample.extend(piece)
        new_tokens = [(int(v), int(c)) for v, c in piece.versions if c]
        done = group.done
        if done:
            self.close(group)
        return PieceEvent(group, started, new_tokens, done)
