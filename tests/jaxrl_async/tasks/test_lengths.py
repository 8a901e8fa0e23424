"""task.lengths: per-prompt heavy-tailed generation lengths, stop tokens ignored."""

import numpy as np
import pytest

from jaxrl_async.tasks.base import TaskConfig
from jaxrl_async.tasks.lengths import sampling_limits


def test_model_lengths_keep_the_runs_max_new_tokens_and_stop_tokens():
    assert sampling_limits("model", 0.1, 1.5, "p1", 64, (2, 3)) == (64, (2, 3))


def test_heavy_tail_lengths_are_fixed_per_prompt_ignore_stop_tokens_and_are_heavy_tailed():
    limits = [sampling_limits("heavy_tail", 0.1, 1.5, f"p{i}", 200, (2,)) for i in range(400)]
    assert all(stops == () for _, stops in limits)
    lengths = np.array([n for n, _ in limits])
    assert lengths.min() >= 20 and lengths.max() == 200  # the Pareto minimum; the clip at max_new_tokens
    assert np.median(lengths) < 40 < lengths.mean()  # a heavy tail: the mean well above the median
    assert sampling_limits("heavy_tail", 0.1, 1.5, "p7", 200, ()) == limits[7]  # the same every time


@pytest.mark.parametrize("key, value, rule", [("lengths", "pareto", "must be one of"),
                                              ("length_scale", 0.0, r"must be in \(0, 1\]"),
                                              ("length_alpha", -1.0, "must be > 0")])
def test_task_config_refuses_a_bad_length_key_naming_it(key, value, rule):
    with pytest.raises(ValueError, match=rf"task\.{key}.*{rule}"):
        TaskConfig(**{key: value})
