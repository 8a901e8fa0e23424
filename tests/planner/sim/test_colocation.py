"""The colocation term (`sim.workers.colocated_slowdown`): while the trainer runs a step, decode
steps cost (1 + slowdown)×. At 0 the simulator is the one without the term, event for event; above 0
a generation-bound run trains fresher tokens, as a real run whose engine shares the trainer's
cores does (docs/calibration.md)."""

import pytest

import planner.policies  # noqa: F401  (registers the baselines)
import planner.policies.lookahead  # noqa: F401
from planner.registry import make_policy
from planner.sim import SimConfig, SimTrainerConfig, WorkerConfig
from planner.ledger_audit import audit
from planner.types import PlanContext
from tests.planner.sim.test_simulator import simulate
from tests.planner.sim.test_workers import group, worker

# Generation-bound: the trainer (~1 s a step) is busy 15% of the time.
GEN = dict(num_workers=2, max_concurrency=16, decode_alpha=0.2, decode_beta=0.002, prefill_per_token=1e-4,
           t_sync=0.01)
TRAINER = SimTrainerConfig(c0=1.0, c1=1e-5, wait_sync=True)
WORKLOAD = {"name": "lognormal", "mu": 3.5, "sigma": 0.5, "max_tokens": 96}
CTX = PlanContext(4, 4, 2, 24)
# This run's figures from the simulator before the term existed (commit 643a420), seed 7.
BEFORE = {"elapsed_s": 166.98503504370933, "staleness_histogram": {"0": 2058, "1": 4675, "2": 7875}, "events": 526,
          "tokens_trained": 14608}
BEFORE_LAST_STARTS = [155.71656544, 162.039378677, 165.939085044]


def run(tmp_path, slowdown=None, tag="run"):
    extra = {} if slowdown is None else {"colocated_slowdown": slowdown}
    cfg = SimConfig(workers=WorkerConfig(**GEN, **extra), trainer=TRAINER)
    result, run_dir = simulate(tmp_path, make_policy("lookahead", CTX), CTX, cfg, workload=WORKLOAD, seed=7, name=tag)
    report = audit(run_dir, max_staleness=CTX.max_staleness)
    assert report.ok and not result.deadlock, report.verdict()
    assert result.summary["groups_dropped"] == 0
    return result, run_dir


def test_a_worker_honours_a_rate_change_in_the_middle_of_a_decode_step():
    w = worker(decode_alpha=1.0, decode_beta=0.0)
    w.enqueue(group(0, [4]))
    w.start_queued(0.0)
    assert w.next_completion() == 4.0
    w.set_slow(1.5, 3.0)  # half-way through the second step: 1.5 steps done, 2.5 to go at 3 s each
    assert w.next_completion() == pytest.approx(1.5 + 2.5 * 3.0)
    w.set_slow(4.5, 1.0)  # one more step done at the slow rate: 1.5 left at 1 s each
    assert w.next_completion() == pytest.approx(6.0)
    (done,) = w.complete(6.0)
    assert done.versions == {0: 4}


def test_a_zero_slowdown_reproduces_the_simulator_without_the_term(tmp_path):
    default, d0 = run(tmp_path, tag="default")
    zero, d1 = run(tmp_path, 0.0, tag="zero")
    assert (d0 / "ledger.jsonl").read_text() == (d1 / "ledger.jsonl").read_text()
    for result in (default, zero):
        assert {k: result.summary[k] for k in BEFORE} == BEFORE
        assert [round(s["start_s"], 9) for s in result.steps][-3:] == BEFORE_LAST_STARTS


def test_a_slowdown_trains_fresher_tokens_in_a_generation_bound_run(tmp_path):
    base, _ = run(tmp_path, 0.0, tag="base")
    assert base.summary["trainer_busy_fraction"] < 0.5  # generation-bound: the trainer waits most of the time
    share0 = lambda r: int(r.summary["staleness_histogram"].get("0", 0)) / r.summary["tokens_trained"]  # noqa: E731
    stale = lambda r: sum(int(s) * t for s, t in r.summary["staleness_histogram"].items()) / r.summary["tokens_trained"]  # noqa: E731,E501
    slow, _ = run(tmp_path, 1.0, tag="slow")
    slower, _ = run(tmp_path, 3.0, tag="slower")
    assert stale(base) > stale(slow) > stale(slower)
    assert share0(base) < share0(slower)
    # Decoding during steps costs more, so the run takes longer — but only during steps: a worker
    # slowed all the time (α, β × 2) is slower still.
    assert base.summary["elapsed_s"] < slow.summary["elapsed_s"] < slower.summary["elapsed_s"]
    always = dict(GEN, decode_alpha=2 * GEN["decode_alpha"], decode_beta=2 * GEN["decode_beta"])
    cfg = SimConfig(workers=WorkerConfig(**always), trainer=TRAINER)
    always_slow, _ = simulate(tmp_path, make_policy("lookahead", CTX), CTX, cfg, workload=WORKLOAD, seed=7, name="all")
    assert slow.summary["elapsed_s"] < 0.8 * always_slow.summary["elapsed_s"]


@pytest.mark.parametrize("value", [-0.1, float("nan")])
def test_a_negative_slowdown_names_the_field(value):
    with pytest.raises(ValueError, match=r"sim\.workers\.colocated_slowdown") as e:
        WorkerConfig(colocated_slowdown=value)
    assert "\n" not in str(e.value)
