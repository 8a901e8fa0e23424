"""Scored groups into one train batch, and the batch's staleness."""

import numpy as np
import pytest

from jaxrl_async.engines.base import SampleOutput
from jaxrl_async.runtime.batching import batch_staleness, make_train_batch
from jaxrl_async.runtime.rollouts import RolloutCollector


def piece(rid, index, tokens, versions, done=False):
    return SampleOutput(rid, index, tokens, [-0.5] * len(tokens), versions, None, done)


def test_the_train_batch_holds_every_sample_with_its_groups_id_and_reward():
    groups = []
    for uid in range(2):
        c = RolloutCollector()
        g = c.open(uid=uid, prompt_id="p", prompt_ids=[1, 2, 3], n=2, attempt=0)
        c.add(piece(f"{uid}.0", 0, [4, 5], [[uid, 2]], done=True))
        c.add(piece(f"{uid}.0", 1, [6], [[uid, 1]], done=True))
        g.rewards = [1.0, 0.0]
        groups.append(g)
    batch = make_train_batch(groups)
    assert np.asarray(batch.group_ids).tolist() == [0, 0, 1, 1]
    assert np.asarray(batch.rewards).tolist() == [1.0, 0.0, 1.0, 0.0]
    assert np.asarray(batch.loss_mask).sum() == 6
    assert batch_staleness(1, groups) == {1: 3, 0: 3}


def test_an_unscored_group_cannot_be_batched():
    c = RolloutCollector()
    g = c.open(uid=0, prompt_id="p", prompt_ids=[1], n=1, attempt=0)
    c.add(piece("0.0", 0, [4], [[0, 1]], done=True))
    with pytest.raises(ValueError, match="never scored"):
        make_train_batch([g])
