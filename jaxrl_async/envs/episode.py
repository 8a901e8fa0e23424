"""The vocabulary of an episode: turns, faults and outcomes.

An episode calls `TurnClient.generate(token_ids)` for each model turn, with the whole sequence so
far: the prompt, every earlier turn's sampled tokens exactly as sampled, and the environment's
tokens since. The client checks that the sequence extends what it recorded (a re-tokenized prefix
is a fault: the trained tokens must be the sampled ones), records the new environment tokens as
untrained, samples the turn on the engine's current weights and returns it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

# Why an episode ended before its environment said so; each is counted in summary.json
# (`episode_faults_by_kind`) and the episode is left out of the loss (no fabricated reward).
FAULT_KINDS = ("env_error", "env_timeout", "env_bad_reply", "too_long", "prefix_mismatch", "load_error")


class EpisodeFault(Exception):
    """An episode cannot go on: `kind` (one of FAULT_KINDS) and a one-line reason."""

    def __init__(self, kind: str, reason: str) -> None:
        if kind not in FAULT_KINDS:
            raise ValueError(f"EpisodeFault kind {kind!r}: must be one of {FAULT_KINDS}")
        super().__init__(f"{kind}: {reason}")
        self.kind, self.reason = kind, reason


@dataclass(frozen=True)
class Turn:
    """One model turn as the engine sampled it.

    Attributes:
      token_ids: the sampled tokens (the stop token included when the turn stopped on one).
      logprobs: the behaviour log-prob of each token (engines/base.py SampleOutput).
      versions: run-length [[version, count], ...] of the weights that sampled each token.
      finish_reason: "stop" or "length".
      queued_s: seconds from the turn's submission to its first token.
      gen_s: seconds from its first token to its last.
    """

    token_ids: list[int]
    logprobs: list[float]
    versions: list[list[int]]
    finish_reason: str
    queued_s: float = 0.0
    gen_s: float = 0.0


class TurnClient(Protocol):
    """What an episode calls to sample a model turn (engine.py's `EpisodeEngine` gives one per episode)."""

    async def generate(self, token_ids: list[int], *, max_new_tokens: int | None = None) -> Turn:
        """Sample a turn continuing `token_ids` (which extend the episode's recorded sequence).
        Raises EpisodeFault("prefix_mismatch") when they do not, ("too_long") when no token fits
        in the context left."""
        ...


@dataclass
class EpisodeResult:
    """What an episode returns: its reward and what a reader wants to see of it.

    Attributes:
      reward: the episode's scalar reward.
      terms: the rubric's named terms (e.g. {"correct": 1.0, "tool_calls": 2}), for samples.jsonl.
      messages: the conversation as chat messages, the model's turns included.
      extracted_answer: for a scored task, the text the scorer saw.
      info: anything else the task wants in samples.jsonl (JSON-serialisable).
    """

    reward: float
    terms: dict[str, float] = field(default_factory=dict)
    messages: list[dict[str, Any]] = field(default_factory=list)
    extracted_answer: str | None = None
    info: dict[str, Any] = field(default_factory=dict)


@dataclass
class EpisodeRecord:
    """An episode as the runtime keeps it (on the sample): its outcome or fault, and per-turn timing.

    Attributes:
      result: the episode's result; None when it faulted.
      fault: "kind: reason" of the fault that ended it; None when it ran to its end.
      fault_kind: the fault's kind (FAULT_KINDS), for the counts.
      turns: per model turn [queued_s, gen_s, env_s]: the wait for the engine, the sampling, and
        the environment step after it (0.0 after the last turn).
      turn_tokens: model tokens sampled in each turn (the ledger's per-turn spans read them).
    """

    result: EpisodeResult | None = None
    fault: str | None = None
    fault_kind: str | None = None
    turns: list[list[float]] = field(default_factory=list)
    turn_tokens: list[int] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        r = self.result
        return {
            "result": None if r is None else {"reward": r.reward, "terms": r.terms, "messages": r.messages,
                                               "extracted_answer": r.extracted_answer, "info": r.info},
            "fault": self.fault, "fault_kind": self.fault_kind, "turns": self.turns, "turn_tokens": self.turn_tokens,
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> EpisodeRecord:
        r = d.get("result")
        return cls(None if r is None else EpisodeResult(**r), d.get("fault"), d.get("fault_kind"),
                   [list(t) for t in d.get("turns", [])], list(d.get("turn_tokens", [])))
