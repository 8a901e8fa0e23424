"""A finite dataset (`num_prompts`) revisits prompts with the same difficulty every epoch."""

import numpy as np
import pytest

from planner.sim.workloads import make_workload


@pytest.mark.parametrize("name", ["lognormal", "bimodal", "heavy_tail"])
def test_a_prompt_is_as_hard_in_every_epoch(name):
    w = make_workload({"name": name, "num_prompts": 50, "sigma": 0.0} if name != "heavy_tail"
                      else {"name": name, "num_prompts": 50, "alpha": 50.0}, group_size=4)
    rng = np.random.default_rng(0)
    first, second = w.sample(rng, 50), w.sample(rng, 50)
    assert first.prompt_ids == second.prompt_ids == list(range(50))
    ratio = second.lengths.mean(axis=1) / first.lengths.mean(axis=1)
    assert np.all(np.abs(ratio - 1) < 0.1), "difficulty must persist across epochs"


def test_without_a_dataset_every_prompt_is_new():
    w = make_workload({"name": "lognormal"}, group_size=2)
    rng = np.random.default_rng(0)
    assert w.sample(rng, 3).prompt_ids == [0, 1, 2] and w.sample(rng, 2).prompt_ids == [3, 4]


def test_a_non_positive_dataset_size_is_rejected_by_name():
    with pytest.raises(ValueError, match="workload.num_prompts=0"):
        make_workload({"name": "lognormal", "num_prompts": 0}, group_size=2)
