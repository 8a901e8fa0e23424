"""Turn the planner's batch (scored groups) into the trainer's padded `TrainBatch`.

An episode's environment tokens stay in its row (the model's later turns read them) with loss mask
0; an episode that ended on a fault has no reward, so its row is like a padding row (group id -1,
mask 0): it moves neither the loss nor its group's advantages.

Row i of the batch is one sample; the samples of one group share `group_id` (its index in the
batch), which is what the GRPO advantage normalises over. The behaviour log-probs are the
engine's, per token, so the loss's importance ratio corrects for every version a token came from.
"""

from __future__ import annotations

from collections.abc import Sequence

from jaxrl_async.runtime.rollouts import GroupRollout
from jaxrl_async.trainer.batch import TrainSample
from jaxrl_async.trainer.batch import TrainBatch, pad_batch
from planner.versions import add_staleness


def make_train_batch(groups: Sequence[GroupRollout], *, rows_multiple: int = 1) -> TrainBatch:
    """Every sample of every group; groups must be scored (`rewards` set)."""
    rows = []
    for gid, group in enumerate(groups):
        if group.rewards is None:
            raise ValueError(f"group {group.uid} is in a batch but was never scored")
        for sample, reward in zip(group.samples, group.rewards, strict=True):
            if sample.faulted:  # no reward to learn from: a row that adds nothing (padding's group id and mask)
                rows.append(TrainSample(group.prompt_ids, sample.token_ids, sample.logprobs, 0.0, -1,
                                        [0] * len(sample.token_ids)))
            else:
                rows.append(TrainSample(group.prompt_ids, sample.token_ids, sample.logprobs, reward, gid,
                                        sample.loss_mask or None))
    return pad_batch(rows, rows_multiple=rows_multiple)


def batch_staleness(step: int, groups: Sequence[GroupRollout]) -> dict[int, int]:
    """Trained tokens by staleness (step − generation version) in batch `step`."""
    hist: dict[int, int] = {}
    for group in groups:
        add_staleness(hist, step, group.token_versions())
    return hist
