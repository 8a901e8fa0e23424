"""`pad_batch`: alignment of tokens, mask and behaviour log-probs; bucketing; padding rows."""

import numpy as np
import pytest

from jaxrl_async.trainer.batch import TrainSample, bucket_length, pad_batch


def test_completion_tokens_are_masked_and_aligned_with_their_logprobs():
    batch = pad_batch([TrainSample([1, 2], [3, 4, 5], [-0.1, -0.2, -0.3], 1.0, 9),
                       ([6], [7], [-0.7], 0.0, 9)], buckets=[8])
    np.testing.assert_array_equal(batch.tokens, [[1, 2, 3, 4, 5, 0, 0, 0], [6, 7, 0, 0, 0, 0, 0, 0]])
    np.testing.assert_array_equal(batch.loss_mask, [[0, 0, 1, 1, 1, 0, 0, 0], [0, 1, 0, 0, 0, 0, 0, 0]])
    np.testing.assert_allclose(batch.behaviour_logprobs[0, 2:5], [-0.1, -0.2, -0.3])
    np.testing.assert_allclose(batch.behaviour_logprobs[1], [0, -0.7, 0, 0, 0, 0, 0, 0])
    np.testing.assert_array_equal(batch.group_ids, [9, 9])
    assert batch.tokens.dtype == np.int32 and batch.loss_mask.dtype == np.float32
    assert batch.ref_logprobs is None


def test_length_is_the_smallest_bucket_that_fits():
    assert bucket_length(5) == 32 and bucket_length(33) == 64 and bucket_length(64) == 64
    assert bucket_length(9, [8, 16, 12]) == 12
    with pytest.raises(ValueError, match="largest bucket 16"):
        bucket_length(17, [8, 16])
    assert pad_batch([([1] * 20, [2] * 20, [0.0] * 20, 0.0, 0)]).seq_len == 64


def test_rows_are_padded_with_inert_rows():
    batch = pad_batch([([1], [2], [-1.0], 1.0, 0)] * 3, buckets=[4], rows_multiple=4)
    assert batch.num_rows == 4
    assert batch.group_ids[3] == -1 and batch.loss_mask[3].sum() == 0 and batch.rewards[3] == 0


@pytest.mark.parametrize("sample, message", [
    (([], [2], [-1.0], 1.0, 0), "empty prompt"),
    (([1], [2, 3], [-1.0], 1.0, 0), "2 completion_ids but 1 completion_logprobs"),
    (([1], [2], [-1.0], 1.0, -1), "group_id=-1"),
])
def test_bad_samples_are_refused_naming_the_sample(sample, message):
    with pytest.raises(ValueError, match=f"sample 0 .*{message}|sample 0 has {message}"):
        pad_batch([sample])
