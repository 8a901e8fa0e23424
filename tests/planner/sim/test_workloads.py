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
        ({"name": "multi_turn", "turns_mean": 12}, "workload.turns_mean=12"),
        ({"name": "multi_turn", "env_fail_p": 1.5}, "workload.env_fail_p=1.5"),
        ({"name": "multi_turn", "env_timeout_s": 0}, "workload.env_timeout_s=0"),
        ({"name": "multi_turn", "env_tail_alpha": 0}, "workload.env_tail_alpha=0"),
    ],
)
def test_bad_workload_configs_name_the_field(values, needle):
    with pytest.raises(ValueError, match=needle.replace("(", r"\(")):
        make_workload(values, 2)


def test_the_registry_lists_every_named_workload():
    assert set(WORKLOADS) == {"lognormal", "bimodal", "heavy_tail", "trace", "multi_turn"}


def test_multi_turn_episodes_sum_to_their_lengths_and_a_failed_step_ends_one():
    w = make_workload({"name": "multi_turn", "turns_mean": 4.0, "max_turns": 6, "max_turn_tokens": 300,
                       "env_fail_p": 0.1, "env_timeout_s": 20.0}, group_size=4)
    d = w.sample(np.random.default_rng(0), 3000)
    episodes = [e for row in d.episodes for e in row]
    assert d.lengths.tolist() == [[sum(e.turns) for e in row] for row in d.episodes]
    assert all(1 <= len(e.turns) <= 6 and len(e.env_s) == len(e.turns) for e in episodes)
    assert all(1 <= t <= 300 for e in episodes for t in e.turns)
    assert max(s for e in episodes for s in e.env_s) == 20.0  # a timeout is killed at the timeout
    ended = [e for e in episodes if e.fault is None]
    failed = [e for e in episodes if e.fault is not None]
    assert {e.fault for e in failed} == {"error", "timeout"}
    assert all(e.env_s[-1] == 20.0 for e in failed if e.fault == "timeout")
    # failures cut episodes short: ~10% per step over ~4 turns
    assert np.mean([len(e.turns) for e in failed]) < np.mean([len(e.turns) for e in ended])
    assert 0.2 < len(failed) / len(episodes) < 0.5
    # the latency's tail: 5% of steps from the Pareto part (>= 5 s), the body's median e^0 = 1 s
    env = np.array([s for e in ended for s in e.env_s])
    assert np.median(env) == pytest.approx(1.0, rel=0.1) and 0.03 < np.mean(env >= 5.0) < 0.08


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
