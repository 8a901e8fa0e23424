"""Assemble the engine's streamed `SampleOutput` pieces into groups.

The engine streams deltas per (request, sample); the runtime needs, per group: when it started
(the first piece, with its first token's version — the planner's `on_group_started`), the tokens
sampled on each version as they arrive (`on_tokens`), and the whole group once all `n` samples
are done (rewards, `on_group_finished`, the batch, the ledger's `versions`).

A multi-turn task's samples are episodes (envs/engine.py): their streams hold the environment's
tokens too, in pieces with `sampled=False`; a sample's `loss_mask` marks them 0 (never trained,
no version), and its done piece brings the episode's record (reward, per-turn tokens and timing).

Request ids are `"<uid>.<attempt>"`: a group regenerated after a fault or a restart is a new
request, so late pieces of its old request (aborted or not) are recognised and ignored.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from jaxrl_async.engines.base import SampleOutput
from jaxrl_async.envs.episode import EpisodeRecord
from planner.types import Versions
from planner.versions import VersionRuns, extend_runs, tokens_by_version


@dataclass
class RolloutSample:
    """One trajectory of a group, as the engine produced it."""

    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)  # behaviour log-prob of each token
    versions: VersionRuns = field(default_factory=list)  # run-length [[version, count], ...] of the sampled tokens
    finish_reason: str | None = None  # set when the sample is done
    loss_mask: list[int] = field(default_factory=list)  # per token, 1 = sampled (trained); [] = all sampled
    episode: EpisodeRecord | None = None  # a multi-turn task's episode, from its done piece

    def extend(self, piece: SampleOutput) -> None:
        if not piece.sampled and not self.loss_mask:
            self.loss_mask = [1] * len(self.token_ids)
        if self.loss_mask:
            self.loss_mask += [int(piece.sampled)] * len(piece.token_ids)
        self.token_ids += piece.token_ids
        self.logprobs += piece.logprobs
        extend_runs(self.versions, piece.versions)
        if piece.done:
            self.finish_reason = piece.finish_reason or "stop"
            self.episode = piece.episode

    def mask(self) -> list[int]:
        """Per token, 1 where the model sampled it (trained), 0 for an episode's environment tokens."""
        return self.loss_mask or [1] * len(self.token_ids)

    @property
    def faulted(self) -> bool:
        """An episode that ended on a fault: it has no reward and is left out of the loss."""
        return self.episode is not None and self.episode.fault is not None

    def turn_versions(self) -> list[Versions]:
        """An episode's sampled tokens by version, one list per model turn (the ledger's per-turn spans)."""
        per_token = [v for v, c in self.versions for _ in range(c)]
        spans, at = [], 0
        for count in self.episode.turn_tokens if self.episode is not None else ():
            spans.append(tokens_by_version([[[v, 1] for v in per_token[at:at + count]]]))
            at += count
        return spans


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

    def turns(self) -> list[tuple[int, Versions]]:
        """(sample, versions) of every model turn of every episode, in order (ledger `turns`); [] single-turn."""
        return [(i, versions) for i, s in enumerate(self.samples) for versions in s.turn_versions()]

    def last_versions(self) -> list[int]:
        """Version of each sample's last token (dressage's L3 reads it)."""
        return [s.versions[-1][0] for s in self.samples if s.versions]

    def to_json(self) -> dict[str, Any]:
        return {
            "uid": self.uid, "prompt_id": self.prompt_id, "prompt_ids": self.prompt_ids,
            "attempt": self.attempt, "rewards": self.rewards, "reward_errors": self.reward_errors,
            "samples": [[s.token_ids, s.logprobs, s.versions, s.finish_reason]
                        + ([s.loss_mask, s.episode.to_json() if s.episode else None]
                           if s.loss_mask or s.episode else []) for s in self.samples],
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> GroupRollout:
        samples = [RolloutSample(list(t), list(lp), [list(v) for v in vs], fr, *episode_part(rest))
                   for t, lp, vs, fr, *rest in d["samples"]]
        return cls(d["uid"], d["prompt_id"], list(d["prompt_ids"]), samples, d["attempt"], True,
                   d["rewards"], d["reward_errors"])


def episode_part(rest: list[Any]) -> tuple[list[int], EpisodeRecord | None]:
    """A saved sample's loss mask and episode (absent for a single-turn sample)."""
    if not rest:
        return [], None
    mask, episode = rest
    return list(mask), None if episode is None else EpisodeRecord.from_json(episode)


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
