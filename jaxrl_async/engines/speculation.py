"""`engine.speculation.*`: when and how an engine speculates its decoding (docs/design.md §2.14).

Speculative sampling drafts `tokens` tokens cheaply, verifies them in one forward pass of the
policy and keeps a prefix of them by rejection sampling, so the emitted tokens are distributed
exactly as plain sampling from the policy would draw them; the reported log-probs stay the
policy's own and every token keeps the version of the weights that verified it. It pays where a
decode step is bound by reading the weights, not by compute: when few sequences are active — the
straggler tail a strict no-drop trainer waits for.

Both engines read this one config: the JAX engine implements it (`engines/jax/`), the vLLM engine
maps it onto vLLM's own `speculative_config`.

Attributes:
  when: never (the default: every existing figure stays as it is) | critical (only the sequences
    the planner marks deadline-critical, `Decision.critical`) | always (whenever the engine is in
    the weight-bound regime, for any policy).
  method: ngram (prompt/n-gram lookup: the continuation of the latest earlier match of the last
    `ngram` tokens; no extra model) | draft (`draft_model` proposes).
  tokens: k, tokens drafted per verification.
  draft_model: method=draft: "layers:N" (the policy's own first N layers and its LM head: no
    extra weights, always on the policy's version) or a model spec of a smaller model.
  ngram: method=ngram: the length of the suffix looked up in the prompt and the tokens so far.
  max_active: the weight-bound regime: speculate only while at most this many sequences are
    active on the engine (a crowded step is compute-bound, where verifying k + 1 tokens costs
    about k + 1 steps).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from planner.configs import check

SPECULATION_WHEN = ("never", "critical", "always")
SPECULATION_METHODS = ("ngram", "draft")

When = Literal["never", "critical", "always"]


@dataclass(frozen=True)
class SpeculationConfig:
    when: When = "never"  # never | critical (the sequences the planner marks) | always (any policy)
    method: str = "ngram"  # ngram (prompt/n-gram lookup, no extra model) | draft (draft_model proposes)
    tokens: int = 4  # k: tokens drafted per verification pass
    draft_model: str | None = None  # method=draft: "layers:N" (the policy's own first N layers) or a model spec
    ngram: int = 2  # method=ngram: length of the suffix looked up in the prompt and the tokens so far
    max_active: int = 8  # speculate only while at most this many sequences are active (weight-bound regime)

    def __post_init__(self) -> None:
        p = "engine.speculation"
        check(self.when in SPECULATION_WHEN, f"{p}.when", self.when, f"must be one of {', '.join(SPECULATION_WHEN)}")
        check(self.method in SPECULATION_METHODS, f"{p}.method", self.method,
              f"must be one of {', '.join(SPECULATION_METHODS)}")
        for name in ("tokens", "ngram", "max_active"):
            value = getattr(self, name)
            check(isinstance(value, int) and not isinstance(value, bool) and value >= 1, f"{p}.{name}", value,
                  "must be an int >= 1")
        check(self.method != "draft" or bool(self.draft_model), f"{p}.draft_model", self.draft_model,
              "must be set when engine.speculation.method=draft (e.g. layers:1)")

    @property
    def enabled(self) -> bool:
        return self.when != "never"
