"""`engine.speculation.*`: when and how an engine speculates its decoding (docs/design.md §2.14).

Speculative sampling drafts `tokens` tokens cheaply, verifies them in one forward pass of the
policy and keeps a prefix of them by rejection sampling, so the emitted tokens are distributed
exactly as plain sampling from the policy would draw them; the reported log-probs stay the
policy's own and every token keeps the version of the weights that verified it. It pays where a
decode step is bound by reading the weights, not by compute: when few query positions are in the
step — the straggler tail a strict no-drop trainer waits for.

Both engines read this one config: the JAX engine implements it (`engines/jax/speculator.py`), the
vLLM engine maps it onto vLLM's own `speculative_config`. The module imports nothing heavy, so
typing a config never loads a backend.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from planner.configs import check

SPECULATION_WHEN = ("never", "critical", "always")
SPECULATION_METHODS = ("ngram", "draft")
# The most tokens drafted per verification. At acceptance a a verification yields on average
# (1 - a^(k+1)) / (1 - a) tokens, at most 1 / (1 - a): at a = 0.8, k = 16 already gets 98% of it,
# so a longer draft buys almost nothing, while the verify pass, the draft model's unrolled loop
# and each call's output grow with k (tokens=100 took 73 s for two training steps).
MAX_TOKENS = 16

When = Literal["never", "critical", "always"]


@dataclass(frozen=True)
class SpeculationConfig:
    """`engine.speculation.*`: exact speculative decoding, and the regime where it runs.

    Attributes:
      when: never (the default: every existing figure stays as it is) | critical (only the
        sequences the planner marks deadline-critical, `Decision.critical`) | always (every
        sequence, for any policy). Either way only in the weight-bound regime (`max_active`).
      method: ngram (prompt/n-gram lookup: the continuation of the latest earlier match of the
        last `ngram` tokens; no extra model; a call drafts only when some sequence has a match at
        its start) | draft (`draft_model` proposes).
      tokens: k, tokens drafted per verification pass; 1 to 16 (MAX_TOKENS: past 16 the expected
        kept run grows by under 2% at acceptance 0.8 while every pass costs more).
      draft_model: method=draft: "layers:N" (the policy's own first N layers and its LM head: no
        extra weights, always on the policy's version) or a model spec of a smaller model.
      ngram: method=ngram: the length of the suffix looked up in the prompt and the tokens so far.
      max_active: the weight-bound regime, in sequences: a step speculates while its query
        positions — one per active sequence plus `tokens` per speculating one — stay within
        (tokens + 1) * max_active, what max_active speculating sequences use (the simulator's
        rule, planner/sim/config.py). when=always speculates every active sequence, so it runs
        while at most max_active sequences are active; when=critical lets a few marked
        stragglers speculate in a step too crowded for all. 8 (k = 4: 40 positions): a GPU
        decode step costs the same at batch 1 and 32 (benchmarks/results/decode_h200.md); a
        CPU step is compute-bound at any batch, where speculation does not pay
        (benchmarks/results/speculation.md). A run whose engine stays crowded (the default
        run: 60-64 of 64 slots active) never speculates; its `speculating` count says so.
    """

    when: When = "never"
    method: str = "ngram"
    tokens: int = 4
    draft_model: str | None = None
    ngram: int = 2
    max_active: int = 8

    def __post_init__(self) -> None:
        p = "engine.speculation"
        check(self.when in SPECULATION_WHEN, f"{p}.when", self.when, f"must be one of {', '.join(SPECULATION_WHEN)}")
        check(self.method in SPECULATION_METHODS, f"{p}.method", self.method,
              f"must be one of {', '.join(SPECULATION_METHODS)}")
        for name in ("tokens", "ngram", "max_active"):
            value = getattr(self, name)
            check(isinstance(value, int) and not isinstance(value, bool) and value >= 1, f"{p}.{name}", value,
                  "must be an int >= 1")
        check(self.tokens <= MAX_TOKENS, f"{p}.tokens", self.tokens,
              f"must be <= {MAX_TOKENS} (a longer draft adds almost no kept tokens and slows every pass)")
        check(self.method != "draft" or bool(self.draft_model), f"{p}.draft_model", self.draft_model,
              "must be set when engine.speculation.method=draft (e.g. layers:1)")

    @property
    def enabled(self) -> bool:
        return self.when != "never"

    def weight_bound(self, active: int, speculating: int) -> bool:
        """Whether a step with `active` sequences, `speculating` of them drafting, is in the
        regime where speculation pays (`max_active` in the class docstring)."""
        return active + self.tokens * speculating <= (self.tokens + 1) * self.max_active
