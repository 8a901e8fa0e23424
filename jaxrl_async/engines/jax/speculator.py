"""The host half of speculative decoding in the JAX engine core: who drafts, and the call that does.

`EngineCore.step` asks its `Speculator` before each decode call (`drafting`): with
`engine.speculation.when` always (every active sample) or critical (the samples of the requests
`mark_critical` named), in the weight-bound regime (`SpeculationConfig.weight_bound`: the step's
query positions within (k + 1) * max_active) and when some drafting sample has a draft now (the
draft model always has one; the n-gram needs a repeated suffix), the call is one
`speculative.engine_speculate_rounds` call of up to `decode_steps_per_call` draft-and-verify
passes (`step`) instead of a plain decode call. The emitted tokens are distributed exactly as
plain sampling's (speculative.py), so the core emits them as it emits a decode call's.

Counters (the core's `counters`, read by JaxEngine into `EngineTiming`): `drafted` tokens,
`accepted` tokens, and `speculating`, the samples that drafted in a call — so a run can tell
that speculation acted.

The jitted call is compiled per core, with the cache's own shardings as its output layout (a
mesh core's cache keeps its layout, as layout.py's steps do).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import jax
import numpy as np

from jaxrl_async.engines.jax import speculative
from jaxrl_async.engines.jax.config import EngineConfig
from jaxrl_async.engines.jax.scheduler import SlotSequence
from jaxrl_async.engines.jax.slots import LiveRequests, Slots
from jaxrl_async.models.attention import KVCache
from jaxrl_async.models.config import ModelConfig


class Speculator:
    """Decides and runs a core's speculative calls (see the module docstring)."""

    def __init__(self, config: EngineConfig, model_config: ModelConfig):
        self.config, self.spec, self.model_config = config, config.speculation, model_config
        self.draft_layers = (speculative.parse_draft_model(self.spec.draft_model, model_config.num_layers)
                             if self.spec.enabled and self.spec.method == "draft" else 0)
        self._step_fn = None

    def drafting(self, slots: Slots, requests: LiveRequests) -> np.ndarray | None:
        """The slots that draft in the next call [S] bool, or None for a plain decode call:
        speculation off, no sample to draft for, outside the weight-bound regime, or no
        drafting sample with a draft now."""
        spec = self.spec
        if not spec.enabled:
            return None
        eligible = [slot for slot, seq in slots.occupied()
                    if spec.when == "always" or seq.request_id in requests.critical]
        if not eligible or not spec.weight_bound(slots.active, len(eligible)):
            return None
        # One token left: nothing to draft.
        if not any(slots.arrays.remaining[slot] > 1 and (
                bool(self.draft_layers) or bool(speculative.ngram_draft(context(slots.seqs[slot], requests), spec.ngram, 1)))
                for slot in eligible):
            return None
        speculating = np.zeros(len(slots), bool)
        speculating[eligible] = True
        return speculating

    def step(self, weights: dict, cache: KVCache, slots: Slots, requests: LiveRequests, speculating: np.ndarray,
             decode_length: Callable[[int], int], counters: Counter):
        """One call of up to `decode_steps_per_call` draft-and-verify passes over every slot.
        Returns (cache, tokens [S, W], log-probs [S, W], count [S]) as a decode call does."""
        a, k, rounds, s = slots.arrays, self.spec.tokens, self.config.decode_steps_per_call, len(slots)
        if self._step_fn is None:  # jitted per core: the cache keeps its layout
            cache_layout = jax.tree.map(lambda x: x.sharding, cache)
            self._step_fn = jax.jit(speculative.engine_speculate_rounds, static_argnums=(0, 1, 2, 3, 4, 5),
                                    donate_argnums=(7,), out_shardings=(cache_layout, *[None] * 6))
        history = np.zeros((s, self.config.max_len if not self.draft_layers else 1), np.int32)
        hist_len = np.zeros(s, np.int32)
        if not self.draft_layers:  # the n-gram drafts on device from each slot's context
            for slot, seq in slots.occupied():
                text = context(seq, requests)
                history[slot, :len(text)], hist_len[slot] = text, len(text)
        active = a.remaining > 0
        need = int(np.max(a.positions + np.minimum(a.remaining, rounds * (k + 1)) + k, where=active, initial=1))
        cache, tokens, logprobs, count, drafted, accepted, passes = self._step_fn(
            self.model_config, decode_length(need), k, self.draft_layers, rounds, self.spec.ngram,
            weights, cache, a.tokens, a.positions, history, hist_len, speculating, a.seeds,
            a.sample_index, a.token_index, a.temperature, a.top_p, a.top_k, a.remaining, a.stop_table())
        drafted = np.asarray(drafted)
        counters["decode_calls"] += 1
        counters["decode_steps"] += int(passes)  # verify passes: one forward of the policy each
        counters["drafted"] += int(drafted.sum())
        counters["accepted"] += int(np.asarray(accepted).sum())
        counters["speculating"] += int(np.count_nonzero(drafted))
        return cache, np.asarray(tokens), np.asarray(logprobs), np.asarray(count)


def context(seq: SlotSequence, requests: LiveRequests) -> list[int]:
    """What the n-gram draft looks in: the sample's prompt and every token it generated (a
    migrated sample's prefix included)."""
    return list(requests[seq.request_id].prompt_ids) + seq.token_ids
