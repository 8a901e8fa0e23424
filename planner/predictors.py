"""Length predictors for the lookahead planner (docs/design.md §2, "Lookahead").

A predictor estimates a group's longest response before it is admitted. The planner uses the
estimate only to *order* admissions (long groups first, so the long tail starts early) and to
size an optional in-flight token budget. Predictions change when a group runs, never whether
the staleness bound holds, so a bad predictor costs throughput, not correctness.

How to add one: a class with `predict(candidate) -> float | None`, `observe(prompt_id, tokens)`,
`state_dict()`/`load_state_dict()`, registered in `PREDICTORS`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from planner.types import Candidate


class NoPredictor:
    """Data-stream order: every candidate looks alike."""

    def predict(self, c: Candidate) -> float | None:
        return None

    def observe(self, prompt_id: int | str, tokens: float) -> None:
        pass

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        pass


class HistoryPredictor(NoPredictor):
    """Per-prompt exponential moving average of the group's longest response.

    RL revisits each prompt once per epoch, and a prompt's difficulty changes slowly, so the last
    epochs predict the next. Unseen prompts get the running mean over all prompts.
    """

    def __init__(self, decay: float = 0.5) -> None:
        self.decay = decay
        self.by_prompt: dict[str, float] = {}
        self.mean: float | None = None
        self._n = 0

    def predict(self, c: Candidate) -> float | None:
        return self.by_prompt.get(str(c.prompt_id), self.mean)

    def observe(self, prompt_id: int | str, tokens: float) -> None:
        key = str(prompt_id)
        old = self.by_prompt.get(key)
        self.by_prompt[key] = tokens if old is None else self.decay * old + (1 - self.decay) * tokens
        self._n += 1
        self.mean = tokens if self.mean is None else self.mean + (tokens - self.mean) / self._n

    def state_dict(self) -> dict[str, Any]:
        return {"by_prompt": dict(self.by_prompt), "mean": self.mean, "n": self._n}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.by_prompt = dict(state["by_prompt"])
        self.mean = state["mean"]
        self._n = state["n"]


class OraclePredictor(NoPredictor):
    """The simulator's true length: an upper bound on what any predictor can buy."""

    def predict(self, c: Candidate) -> float | None:
        return None if c.oracle_tokens is None else float(c.oracle_tokens)


PREDICTORS: dict[str, type[NoPredictor]] = {
    "none": NoPredictor,
    "history": HistoryPredictor,
    "oracle": OraclePredictor,
}


def make_predictor(name: str) -> NoPredictor:
    try:
        return PREDICTORS[name]()
    except KeyError:
        raise ValueError(f"policy.predictor={name}: unknown predictor (known: {', '.join(PREDICTORS)})") from None
