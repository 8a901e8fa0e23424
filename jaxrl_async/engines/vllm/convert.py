"""The vLLM engine's pure conversions, apart from vLLM so that they are tested where it is absent.

`engines/vllm/engine.py` needs vLLM to run, and its tests skip without it (CI runs them in the
vLLM job only). What it computes from plain values lives here instead, importing nothing of
vLLM: the sampling settings of one vLLM request, how a vLLM finish reason ends (or continues) a
sample, vLLM's weight-version spans as the contract's run-length versions,
`engine.speculation.*` as vLLM's `speculative_config`, and the LoRA engine arguments and
adapter-version bookkeeping of a run that pushes adapters (sync mode `pinned`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from jaxrl_async.engines.speculation import SpeculationConfig
from planner.configs import check
from planner.versions import append_run

FINISH_REASONS = ("stop", "length", "abort")  # the contract's (engines/base.py FinishReason)
# The `max_lora_rank` values vLLM accepts (vllm/config/lora.py `MaxLoRARanks`, vLLM 0.32); its
# LoRA kernels are compiled for these widths, an adapter of smaller rank is zero-padded.
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


def sampling_kwargs(sp: Any, n: int, first_index: int, remaining: int) -> dict[str, Any]:
    """`vllm.SamplingParams(**...)` (less `output_kind`) of a vLLM request continuing `n` samples.

    `sp` is the request's `SamplingParams`; `first_index` the index of its first sample and
    `remaining` the tokens that sample may still generate. A resubmitted single sample gets the
    seed `seed + index`, so samples of one group never share a random stream. vLLM spells "no
    top-k" -1 (ours 0), and `ignore_eos`: the stop tokens are the request's, nothing else.
    """
    return dict(
        n=n, max_tokens=remaining, temperature=sp.temperature, top_p=sp.top_p,
        top_k=sp.top_k if sp.top_k > 0 else -1,
        seed=None if sp.seed is None else sp.seed + (first_index if n == 1 else 0),
        stop_token_ids=list(sp.stop_token_ids), ignore_eos=True, logprobs=0, detokenize=False)


def vllm_priority(priority: float) -> int:
    """vLLM's integer priority of a request (lower first): the group's deadline, floored."""
    return int(math.floor(priority))


def piece_finish(reason: str, *, resubmit: bool, user_aborted: bool, remaining: int) -> tuple[str | None, bool]:
    """(finish_reason, continues) of a sample whose vLLM request ended with `reason`.

    A request aborted by a `resubmit` weight update continues (in a new vLLM request) unless the
    user aborted it too or it has no tokens left; then no finish reason is given. Otherwise the
    sample ends: vLLM's "stop", "length" and "abort" are the contract's, any other reason (e.g.
    "error") ends it as "stop".
    """
    if reason == "abort" and resubmit and not user_aborted and remaining > 0:
        return None, True
    return (reason if reason in FINISH_REASONS else "stop"), False


def versions_from_spans(spans: Iterable[Any] | None, count: int) -> list[list[int]]:
    """vLLM's `WeightVersionSpan`s (`version` str, `start`, `end`) -> run-length [[version, n], ...]
    covering exactly the sample's `count` new tokens (RuntimeError otherwise: a version is never guessed)."""
    if not count:
        return []
    if not spans:  # no step of this request was labelled (cannot happen after start); be explicit
        raise RuntimeError(f"vLLM returned {count} tokens without weight-version spans")
    out: list[list[int]] = []
    for span in spans:
        if span.end > span.start:
            append_run(out, int(span.version), span.end - span.start)
    covered = sum(n for _, n in out)
    if covered != count:
        raise RuntimeError(f"vLLM version spans cover {covered} tokens, the sample has {count}")
    return out


def speculative_config(spec: SpeculationConfig, max_num_seqs: int) -> dict[str, Any] | None:
    """vLLM's `speculative_config` engine argument for `engine.speculation.*` (None: no speculation).

    vLLM speculates with one config for every request in a batch, verifying by rejection sampling
    (`rejection_sample_method="standard"`), so the emitted tokens and their raw log-probs stay the
    target model's. What maps, and what cannot:
    - `when=always` speculates; `max_active` becomes vLLM's batch-size schedule
      (`num_speculative_tokens_per_batch_size`): `tokens` drafts while at most `max_active`
      requests are scheduled in a step, none above (the compute-bound regime). With
      `max_active >= max_num_seqs` every step speculates and no schedule is passed.
    - `when=critical` is refused: vLLM has no per-request switch, so the planner's
      `Decision.critical` cannot reach it (engine=jax implements it).
    - `method=ngram`: vLLM's prompt lookup with a window of exactly `ngram` tokens
      (`prompt_lookup_min = prompt_lookup_max = ngram`), like engine=jax's n-gram draft.
    - `method=draft`: `draft_model` is the draft's HF directory (or hub name) that vLLM loads as
      `method="draft_model"`; `layers:N` (the policy's own first layers) is engine=jax's only.
    """
    if not spec.enabled:
        return None
    p = "engine.speculation"
    check(spec.when != "critical", f"{p}.when", spec.when,
          "vLLM cannot speculate per request (one speculative_config for every request); "
          f"use {p}.when=always (gated by {p}.max_active) or engine=jax")
    out: dict[str, Any] = {"num_speculative_tokens": spec.tokens, "rejection_sample_method": "standard"}
    if spec.method == "ngram":
        out.update(method="ngram", prompt_lookup_min=spec.ngram, prompt_lookup_max=spec.ngram)
    else:
        check(not spec.draft_model.startswith("layers:"), f"{p}.draft_model", spec.draft_model,
              "layers:N (the policy's own first layers) is engine=jax's only; "
              "engine=vllm needs a draft model's HF directory")
        out.update(method="draft_model", model=spec.draft_model)
    if spec.max_active < max_num_seqs:
        out["num_speculative_tokens_per_batch_size"] = [
            (1, spec.max_active, spec.tokens), (spec.max_active + 1, max_num_seqs, 0)]
    return out


def max_lora_rank(rank: int) -> int:
    """vLLM's `max_lora_rank` for adapters of `rank`: the smallest admissible width >= rank."""
    fits = [r for r in VLLM_LORA_RANKS if r >= rank]
    check(rank >= 1 and bool(fits), "trainer.lora.rank", rank,
          f"engine=vllm serves LoRA ranks 1..{max(VLLM_LORA_RANKS)} (vLLM's max_lora_rank)")
    return fits[0]


def lora_engine_args(rank: int, versions: int) -> dict[str, Any]:
    """vLLM's engine arguments for serving `versions` adapters of `rank` at once.

    `max_loras` bounds the distinct adapters in one scheduled batch: every version an in-flight
    request is pinned to (at most max_staleness + 1) fits, so none of them waits for another to
    finish. `max_cpu_loras` holds one more, the adapter just added while the oldest is still in use.
    """
    return dict(enable_lora=True, max_lora_rank=max_lora_rank(rank), max_loras=versions,
                max_cpu_loras=versions + 1)


def pinned_versions(spans: Iterable[Any] | None, count: int, version: int, base: int) -> list[list[int]]:
    """The run-length versions of a sample generated under adapter `version` (sync mode pinned):
    all `count` tokens are `version`'s. vLLM's own spans must cover them and all name `base`, the
    label of the base weights it started with: a LoRA engine never swaps its base."""
    seen = versions_from_spans(spans, count)
    if any(v != base for v, _ in seen):
        raise RuntimeError(f"vLLM labelled tokens {seen} under adapter v{version}; the base weights are "
                           f"version {base} and never change with LoRA")
    return [[version, count]] if count else []


class AdapterVersions:
    """Which adapter versions vLLM holds and how many live vLLM requests use each (sync mode pinned).

    The newest serves every new request; an older one is removable once its last request ends
    (`add` and `release` return the versions to remove). Before the first push the engine serves
    the base weights, its start version, with no adapter (`newest` None): an untrained adapter
    (B = 0) is the base exactly."""

    def __init__(self) -> None:
        self.newest: int | None = None
        self.users: dict[int, int] = {}  # resident version -> live requests pinned to it
        self.added = self.removed = 0

    def check_new(self, version: int) -> None:
        if version in self.users:
            raise ValueError(f"update_weights: adapter version={version} is already resident")

    def add(self, version: int) -> list[int]:
        self.check_new(version)
        self.newest = version
        self.users[version] = 0
        self.added += 1
        return self._idle()

    def acquire(self) -> int | None:
        """Pin one new request to the newest adapter; its version (None: the base, no adapter)."""
        if self.newest is not None:
            self.users[self.newest] += 1
        return self.newest

    def release(self, version: int | None) -> list[int]:
        if version is not None:
            self.users[version] -= 1
        return self._idle()

    def summary(self, versions: int) -> dict:
        """EngineStats' and summary.json's `adapter_versions` (the JAX engine's keys where they mean
        the same): `versions` (max_loras), the resident versions, the pushes each added as one
        more version, and the versions removed once their last request ended."""
        return {"versions": versions, "resident": sorted(self.users), "pushes_pinned": self.added,
                "removed": self.removed}

    def _idle(self) -> list[int]:
        idle = [v for v, n in self.users.items() if n == 0 and v != self.newest]
        for v in idle:
            del self.users[v]
        self.removed += len(idle)
        return idle
