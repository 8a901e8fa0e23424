"""Property tests on the real simulator: random small clusters, workloads and faults (docs/design.md §2, §7).

Each example composes a typed run config (`SimulateConfig.from_mapping`, the CLI's own path), runs
it with `run_simulation` and audits the ledger it wrote (`planner.audit`, which trusts nothing the
run computed). Sizes are tiny (≤ 64 tokens a trajectory, ≤ 90 groups) so one example takes a few
milliseconds; the cluster is what varies: uneven worker speeds, engines with fewer slots than the
admission quota, drain or in-flight weight sync with a sync cost, and worker deaths at random
times (resume or regenerate, restart or never).

- `lookahead` (ours): audit ok, every trained token within η, zero drops, nothing lost, no
  deadlock, and exactly B·S groups trained.
- every strict baseline: every trained token within its own bound (`staleness_bound`: η, or
  S + ⌈(W−1)/P⌉ for windowed FIFO) and no deadlock (drops allowed).

Honest limit built into the strategy: a worker that dies for good takes its cluster with it when
it was the last one, which no policy survives; faults without restart therefore spare one worker.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from planner.configs import build
from planner.registry import POLICIES, policy_class
from planner.sim.config import FaultConfig
from planner.ledger_audit import audit
from planner.tools.simulate import SimulateConfig, run_simulation

policy_class("lookahead")  # registers every policy
STRICT_BASELINES = tuple(sorted(name for name, cls in POLICIES.items() if cls.strict and name != "lookahead"))
SPEEDS = (0.25, 0.5, 1.0, 1.5, 3.0)


@st.composite
def workloads(draw):
    """A built-in workload with random parameters and a small truncation limit."""
    common = {"max_tokens": draw(st.integers(1, 64)), "prompt_tokens": draw(st.integers(0, 64)),
              "prompt_sigma": draw(st.sampled_from((0.0, 0.3, 1.0)))}
    name = draw(st.sampled_from(("lognormal", "bimodal", "heavy_tail")))
    if name == "lognormal":
        own = {"mu": draw(st.floats(0.0, 4.0)), "sigma": draw(st.floats(0.0, 1.5))}
    elif name == "bimodal":
        own = {"short_mean": draw(st.floats(1.0, 8.0)), "long_mean": draw(st.floats(8.0, 64.0)),
               "p_long": draw(st.floats(0.0, 1.0)), "sigma": draw(st.floats(0.0, 0.5))}
    else:
        own = {"scale": draw(st.floats(1.0, 8.0)), "alpha": draw(st.floats(0.3, 3.0))}
    return {"name": name, **common, **own}


@st.composite
def clusters(draw, group_size: int):
    """Workers (uneven speeds, slot limits down to one group, drain/partial/pinned sync), trainer, faults."""
    num_workers = draw(st.integers(1, 4))
    workers = {
        "num_workers": num_workers,
        "speeds": [draw(st.sampled_from(SPEEDS)) for _ in range(num_workers)],
        "max_concurrency": group_size * draw(st.sampled_from((1, 2, 3, 8, 64))),
        "kv_capacity": draw(st.sampled_from((64, 512, 4_000_000))),  # below one group's footprint: one at a time
        "decode_alpha": draw(st.sampled_from((0.01, 0.1, 1.0))),
        "prefill_per_token": draw(st.sampled_from((0.0, 0.01))),
        "t_sync": draw(st.sampled_from((0.0, 0.5, 5.0, 30.0))),
        "sync_mode": draw(st.sampled_from(("drain", "partial", "pinned"))),
    }
    if workers["sync_mode"] == "pinned":
        workers["resident_versions"] = draw(st.sampled_from((None, 1, 2)))  # 1: every update waits for a free slot
    restart_after = draw(st.sampled_from((None, 0.0, 3.0, 40.0)))
    # Without restarts at least one worker must survive (else no policy can finish: honest limit).
    can_fail = num_workers if restart_after is not None else num_workers - 1
    events = []
    if can_fail:
        for _ in range(draw(st.integers(0, 3))):
            events.append({"time": draw(st.floats(0.0, 120.0)), "worker": draw(st.integers(0, can_fail - 1))})
    faults = {"events": events, "recovery": draw(st.sampled_from(("resume", "regenerate"))),
              "restart_after": restart_after}
    trainer = {"c0": draw(st.sampled_from((0.1, 1.0, 5.0, 20.0))), "c1": draw(st.sampled_from((0.0, 1e-3)))}
    return {"workers": workers, "trainer": trainer, "faults": faults,
            "admission_window": draw(st.sampled_from((None, 1, 3)))}


# Our planner's own knobs: predictors only reorder admission, caps only lower the quota (docs/design.md §2).
LOOKAHEAD_PARAMS = st.fixed_dictionaries({
    "predictor": st.sampled_from(("none", "history", "oracle")),
    "refine_on_start": st.booleans(),
    "max_inflight_groups": st.sampled_from((None, 1, 4)),
    "kv_token_budget": st.sampled_from((None, 16, 1000)),
})


@st.composite
def runs(draw, params=st.just({})):
    """A whole `planner.simulate` config as a mapping, less the policy's name (`with_policy`).
    Native parameters not drawn come from the policy's default η mapping."""
    n = draw(st.integers(1, 4))
    return {
        "policy": draw(params),
        "max_staleness": draw(st.integers(0, 4)),
        "batch_groups": draw(st.integers(1, 6)),
        "group_size": n,
        "steps": draw(st.integers(3, 15)),
        "seed": draw(st.integers(0, 2**16)),
        "workload": draw(workloads()),
        "sim": draw(clusters(n)),
    }


def simulate_and_audit(name, mapping):
    """Run and audit at the policy's own bound (η unless a strict policy's bound is looser)."""
    config = SimulateConfig.from_mapping({**mapping, "policy": {"name": name, **mapping["policy"]}})
    bound = config.build_policy().staleness_bound()
    with tempfile.TemporaryDirectory() as out:
        result = run_simulation(config, out, plots=False)
        report = audit(Path(out), config.ctx.max_staleness if bound is None else bound)
    return config, result, report


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mapping=runs(LOOKAHEAD_PARAMS))
def test_lookahead_keeps_the_bound_drops_nothing_loses_nothing_and_trains_every_step(mapping):
    config, result, report = simulate_and_audit("lookahead", mapping)
    ctx, s = config.ctx, result.summary
    assert not result.deadlock, s
    assert report.ok, report.verdict()
    assert report.max_token_staleness <= ctx.max_staleness, report.verdict()
    assert s["groups_dropped"] == report.groups_dropped == 0, s["drops_by_reason"]
    assert report.lost == [] and s["groups_lost"] == 0
    assert s["groups_trained"] == report.groups_trained == ctx.batch_groups * ctx.total_steps
    assert s["groups_admitted"] == report.groups_admitted == ctx.batch_groups * ctx.total_steps


@pytest.mark.parametrize("name", STRICT_BASELINES)
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mapping=runs())
def test_every_strict_baseline_keeps_the_bound_and_finishes(name, mapping):
    _, result, report = simulate_and_audit(name, mapping)
    assert not result.deadlock, result.summary
    assert report.max_token_staleness <= report.max_staleness, report.verdict()  # the policy's own bound
    assert report.ok, report.verdict()


def with_stalls(mapping, stall_prob, stall_timeout_s):
    """`mapping` with attempts that hang on their worker and the runtime's stall watchdog."""
    sim = mapping["sim"]
    return {**mapping, "sim": {**sim, "faults": {**sim["faults"], "stall_prob": stall_prob,
                                                 "stall_timeout_s": stall_timeout_s}}}


STALL_PROBS = st.sampled_from((0.2, 0.5, 0.8))
STALL_TIMEOUTS = st.sampled_from((0.5, 10.0, 200.0))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(mapping=runs(LOOKAHEAD_PARAMS), stall_prob=STALL_PROBS, stall_timeout_s=STALL_TIMEOUTS)
def test_lookahead_with_never_finishing_attempts_finishes_keeps_the_bound_and_loses_nothing(
        mapping, stall_prob, stall_timeout_s):
    config, result, report = simulate_and_audit("lookahead", with_stalls(mapping, stall_prob, stall_timeout_s))
    ctx, s = config.ctx, result.summary
    assert not result.deadlock, s
    assume(s["groups_stalled"] > 0)  # the case under test: some attempt really hung and was regenerated
    assert report.ok, report.verdict()
    assert report.max_token_staleness <= ctx.max_staleness, report.verdict()
    assert s["groups_dropped"] == report.groups_dropped == 0, s["drops_by_reason"]
    assert report.lost == [] and s["groups_lost"] == 0
    assert report.readmissions >= s["groups_stalled"]
    assert s["groups_trained"] == report.groups_trained == ctx.batch_groups * ctx.total_steps


@pytest.mark.parametrize("name", STRICT_BASELINES)
@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(mapping=runs(), stall_prob=STALL_PROBS, stall_timeout_s=STALL_TIMEOUTS)
def test_every_strict_baseline_with_never_finishing_attempts_finishes_and_keeps_the_bound(
        name, mapping, stall_prob, stall_timeout_s):
    _, result, report = simulate_and_audit(name, with_stalls(mapping, stall_prob, stall_timeout_s))
    assert not result.deadlock, result.summary
    assume(result.summary["groups_stalled"] > 0)
    assert report.max_token_staleness <= report.max_staleness, report.verdict()  # the policy's own bound
    assert report.ok and report.lost == [], report.verdict()


def test_without_a_stall_watchdog_a_hung_attempt_is_a_one_line_config_error():
    with pytest.raises(ValueError, match=r"sim.faults.stall_timeout_s=None: must be set when sim.faults.stall_prob "
                                         r"> 0") as info:
        build(FaultConfig, {"stall_prob": 0.5, "stall_timeout_s": None}, "sim.faults")
    assert "\n" not in str(info.value)
