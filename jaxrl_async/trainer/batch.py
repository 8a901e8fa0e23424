"""The trainer's input: one batch of scored trajectories as padded arrays.

Token alignment: `tokens[i, t]` is the t-th token of prompt + completion; `loss_mask[i, t]`,
`behaviour_logprobs[i, t]` and `ref_logprobs[i, t]` all describe the prediction *of* `tokens[i, t]`
(made from the logits at position t - 1). A prompt therefore needs at least one token.

Padding: sequences are right padded to a length bucket so that a run compiles the train step
once per bucket, not once per batch; rows may be padded to a multiple (micro-batches, data
shards) with dummy rows whose `group_id` is -1 and whose mask is 0 — they add nothing to the
loss, the advantages or the metrics.
"""

from __future__ import annotations

from typing import NamedTuple, Sequence

import jax
import numpy as np
from flax import struct


@struct.dataclass
class TrainBatch:
    tokens: jax.Array  # [N, T] int32, prompt + completion, right padded with 0
    loss_mask: jax.Array  # [N, T] float32, 1 on completion tokens, 0 on prompt and padding
    behaviour_logprobs: jax.Array  # [N, T] float32, log mu(token) at generation, 0 where masked
    rewards: jax.Array  # [N] float32, one scalar reward per trajectory
    group_ids: jax.Array  # [N] int32, samples of one prompt share an id >= 0; -1 = padding row
    ref_logprobs: jax.Array | None = None  # [N, T] float32, reference policy, for the KL term
    # Static (part of the jit key, not an array): every row has at most this many loss-masked
    # tokens, and the loss computes the LM head only at that many positions a row
    # (trainer/step.py `sequence_logprobs`); 0 = at every position.
    scored_width: int = struct.field(pytree_node=False, default=0)

    @property
    def num_rows(self) -> int:
        return self.tokens.shape[0]

    @property
    def seq_len(self) -> int:
        return self.tokens.shape[1]


class TrainSample(NamedTuple):
    """One trajectory as the runtime holds it (plain tuples of the same order work too)."""

    prompt_ids: Sequence[int]
    completion_ids: Sequence[int]
    completion_logprobs: Sequence[float]  # behaviour log-prob of each completion token
    reward: float
    group_id: int  # -1: a row left out (an episode that faulted): its mask must be all 0
    completion_mask: Sequence[int] | None = None  # per completion token, 1 = trained; None = all (single-turn)


def bucket_length(length: int, buckets: Sequence[int] | None = None, min_len: int = 32) -> int:
    """Smallest bucket >= length: the given sorted buckets, or powers of two from `min_len`."""
    if buckets is None:
        out = min_len
        while out < length:
            out *= 2
        return out
    for b in sorted(buckets):
        if b >= length:
            return b
    raise ValueError(f"sequence length {length} exceeds the largest bucket {max(buckets)} (buckets={list(buckets)})")


def scored_width(loss_mask: np.ndarray, seq_len: int, min_width: int = 8) -> int:
    """How many positions a row the loss reads: the most loss-masked tokens of any row, rounded up
    to a power of two from `min_width` (so that a run compiles the step for a few widths, not one
    per batch); 0 (every position) when that is not fewer than the seq_len - 1 predicted ones."""
    width = bucket_length(int((loss_mask > 0).sum(axis=1).max(initial=0)), min_len=min_width)
    return width if width < seq_len - 1 else 0


def pad_batch(
    samples: Sequence[TrainSample | tuple],
    *,
    buckets: Sequence[int] | None = None,
    rows_multiple: int = 1,
) -> TrainBatch:
    """Build a `TrainBatch` (host NumPy arrays) from python lists, padding T to a length bucket
    (`bucket_length`) and N up to a multiple of `rows_multiple` with dummy rows."""
    if not samples:
        raise ValueError("pad_batch: samples is empty")
    if rows_multiple < 1:
        raise ValueError(f"pad_batch: rows_multiple={rows_multiple} must be >= 1")
    samples = [TrainSample(*s) for s in samples]
    for i, s in enumerate(samples):
        if len(s.prompt_ids) < 1:
            raise ValueError(f"pad_batch: sample {i} has an empty prompt (the first completion token needs a prefix)")
        if len(s.completion_logprobs) != len(s.completion_ids):
            raise ValueError(
                f"pad_batch: sample {i} has {len(s.completion_ids)} completion_ids but "
                f"{len(s.completion_logprobs)} completion_logprobs")
        if s.completion_mask is not None and len(s.completion_mask) != len(s.completion_ids):
            raise ValueError(f"pad_batch: sample {i} has {len(s.completion_ids)} completion_ids but "
                             f"{len(s.completion_mask)} completion_mask entries")
        left_out = s.completion_mask is not None and not any(s.completion_mask)
        if int(s.group_id) < 0 and not (int(s.group_id) == -1 and left_out):
            raise ValueError(f"pad_batch: sample {i} group_id={s.group_id} must be >= 0 (-1 marks padding rows "
                             "and rows left out, whose completion_mask is all 0)")
    longest = max(len(s.prompt_ids) + len(s.completion_ids) for s in samples)
    seq_len = bucket_length(longest, buckets)
    rows = -(-len(samples) // rows_multiple) * rows_multiple

    tokens = np.zeros((rows, seq_len), np.int32)
    mask = np.zeros((rows, seq_len), np.float32)
    behaviour = np.zeros((rows, seq_len), np.float32)
    rewards = np.zeros((rows,), np.float32)
    group_ids = np.full((rows,), -1, np.int32)
    for i, s in enumerate(samples):
        p, c = len(s.prompt_ids), len(s.completion_ids)
        tokens[i, :p] = s.prompt_ids
        tokens[i, p:p + c] = s.completion_ids
        mask[i, p:p + c] = 1.0 if s.completion_mask is None else s.completion_mask
        behaviour[i, p:p + c] = s.completion_logprobs
        rewards[i] = s.reward
        group_ids[i] = s.group_id
    return TrainBatch(tokens=tokens, loss_mask=mask, behaviour_logprobs=behaviour,
                      rewards=rewards, group_ids=group_ids, scored_width=scored_width(mask, seq_len))
