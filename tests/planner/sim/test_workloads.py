"""Response-length workloads: synthetic draws, traces, and finite datasets (`num_prompts`) whose
prompts keep their difficulty every epoch."""

import numpy as np
import pytest

from planner.sim.trace import TraceGroup, write_trace
from planner.sim.workloads import WORKLOADS, make_workload


@pytest.mark.parametrize("name", ["lognormal", "bimodal", "heavy_tail"])
def test_synthetic_workloads_draw_clipped_integer_lengths(name):
    w = make_workload({"name": name, "max_tokens": 1000}, group_size=4)
    d = w.sample(np.random.default_rng(0), 5000)
    assert d.lengths.shape == (5000, 4) and d.lengths.dtype == np.int64
    assert d.lengths.min() >= 1 and d.lengths.max() == 1000  # the truncation mass exists
    assert len(set(d.prompt_ids)) == 5000


def test_prompt_difficulty_makes_a_groups_lengths_correlate():
    w = make_workload({"name": "lognormal", "sigma": 0.3, "prompt_sigma": 1.0, "max_tokens": 10**7}, group_size=2)
    logs = np.log(w.sample(np.random.default_rng(1), 20000).lengths)
    assert np.corrcoef(logs[:, 0], logs[:, 1])[0, 1] > 0.8
    flat = make_workload({"name": "lognormal", "sigma": 0.3, "prompt_sigma": 0.0, "max_tokens": 10**7}, group_size=2)
    logs = np.log(flat.sample(np.random.default_rng(1), 20000).lengths)
    assert abs(np.corrcoef(logs[:, 0], logs[:, 1])[0, 1]) < 0.05


def test_the_same_seed_draws_the_same_lengths():
    a = make_workload({"name": "bimodal"}, 3).sample(np.random.default_rng(7), 100).lengths
    b = make_workload({"name": "bimodal"}, 3).sample(np.random.default_rng(7), 100).lengths
    assert (a == b).all()


def test_a_trace_workload_replays_in_order_and_cycles(tmp_path):
    write_trace(tmp_path / "t.jsonl", [TraceGroup("a", (1, 2)), TraceGroup("b", (3, 4), prompt_tokens=9)])
    w = make_workload({"name": "trace", "path": str(tmp_path / "t.jsonl"), "prompt_tokens": 5}, 2)
    d = w.sample(np.random.default_rng(0), 3)
    assert d.prompt_ids == ["a", "b", "a"]
    assert d.lengths.tolist() == [[1, 2], [3, 4], [1, 2]] and d.prompt_tokens.tolist() == [5, 9, 5]
    assert w.sample(np.random.default_rng(0), 1).prompt_ids == ["b"]


@pytest.mark.parametrize(
    ("values", "needle"),
    [
        ({"name": "zipf"}, "workload=zipf: unknown workload"),
        ({"name": "lognormal", "sigmaa": 1}, "workload.sigmaa: unknown key"),
        ({"name": "lognormal", "sigma": -1}, "workload.sigma=-1"),
        ({"name": "bimodal", "p_long": 2}, "workload.p_long=2"),
        ({"name": "trace"}, "workload.path: required"),
    ],
)
def test_bad_workload_configs_name_the_field(values, needle):
    with pytest.raises(ValueError, match=needle.replace("(", r"\(")):
        make_workload(values, 2)


def test_the_registry_lists_every_named_workload():
    assert set(WORKLOADS) == {"lognormal", "bimodal", "heavy_tail", "trace"}


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
