"""A short real run writes a complete timing trace that survives a resume, and its calibrated
replay predicts it (looser bounds than benchmarks/bench_calibration.py's: a few steps, a shared
machine)."""

import json

import jax
import pytest
import yaml

from planner.ledger import read_ledger
from planner.ledger_audit import audit
from planner.tools.calibrate import calibrate
from planner.fidelity import compare
from planner.run_trace import TRACE_FILE, read_run_trace
from planner.tools.simulate import SimulateConfig, run_simulation
from tests.helpers.train_runs import make_job, run_within

pytestmark = pytest.mark.slow
RUN = ["steps=10", "batch_groups=4", "group_size=4", "max_new_tokens=8", "checkpoint_every=0"]


def test_a_short_run_is_traced_calibrated_and_replayed_within_loose_bounds(tmp_path):
    # The run's compile is part of what is fitted (the warm-up): an earlier test on this xdist
    # worker may have compiled the same programs, so the in-memory caches are emptied first.
    jax.clear_caches()
    real = tmp_path / "real"
    summary = run_within(make_job(real, RUN), 600)
    assert summary["audit_ok"]
    events = list(read_run_trace(real / TRACE_FILE))
    kinds = [e["event"] for e in events]
    admits = {e["uid"] for e in events if e["event"] == "admit"}
    assert len(admits) == summary["groups_admitted"] >= 40
    started = {e["uid"] for e in events if e["event"] == "start"}
    trained = {g["uid"] for e in read_ledger(real / "ledger.jsonl") if e["event"] == "train" for g in e["groups"]}
    assert trained <= started <= admits and len(trained) == 40 and kinds.count("train") == 10
    assert kinds.count("publish") == kinds.count("synced") == kinds.count("load") == 9  # no push after the last step
    for e in events:
        if e["event"] == "finish":
            assert len(e["lengths"]) == 4 and all(1 <= n <= 8 for n in e["lengths"])
    decode = [e for e in events if e["event"] == "decode"]
    assert sum(e["tokens"] for e in decode) == summary["tokens_generated"]  # every iteration is counted
    # The engine shares the trainer's device: iterations during steps are traced apart, for the
    # colocation fit (this trainer-bound run generates the next batch while a step runs).
    assert [e["colocated"] for e in events if e["event"] == "run"] == [True]
    in_steps = [e for e in decode if e.get("train")]
    assert in_steps
    assert all(e["t"] <= f["t"] for e, f in zip(events, events[1:]) if e["event"] == f["event"] == "admit")

    cal = calibrate(real)
    (real / "calibration.yaml").write_text(yaml.safe_dump(cal))  # as the command line writes it
    w = cal["sim"]["workers"]
    assert w["decode_alpha"] > 0 and w["load_lag"] > 0 and w["max_concurrency"] == 32
    colo = cal["fit"]["colocation"]
    assert colo["colocated"] and colo["lines_in_steps"] == len([e for e in in_steps if not e.get("compile")])
    # Fitted only with iterations on both sides of the steps; otherwise 0 (the simulator as before).
    assert colo["fitted"] == (colo["lines_outside"] > 0) and (colo["fitted"] or w["colocated_slowdown"] == 0)
    config = SimulateConfig.from_mapping({
        "policy": {"name": "lookahead"}, "max_staleness": 1, "batch_groups": 4, "group_size": 4, "steps": 10,
        "seed": 0, "workload": {"name": "trace", "path": str(real / TRACE_FILE), "prompt_tokens": 256},
        "sim": {}, "calibration": str(real / "calibration.yaml")})
    result = run_simulation(config, tmp_path / "sim", plots=False)
    assert not result.deadlock and audit(tmp_path / "sim", 1).ok
    out = compare(real, tmp_path / "sim", warmup=3)
    assert abs(out["steps_per_hour_error"]) < 0.5, out
    assert abs(out["trainer_busy_error"]) < 0.25 and abs(out["generator_busy_error"]) < 0.25, out
    assert out["staleness_tv"] < 0.25, out
    # Both summaries' steady state is the fidelity's (one rule); the whole-run figures compare like
    # with like because the replay includes the fitted compile warm-up (most of this short run).
    assert summary["steps_per_hour_steady"] == pytest.approx(out["real"]["steps_per_hour"])
    assert result.summary["steps_per_hour_steady"] == pytest.approx(out["sim"]["steps_per_hour"])
    assert w["compile_s"] > 0 and cal["sim"]["trainer"]["compile_s"] > 0
    assert result.summary["steps_per_hour"] == pytest.approx(summary["steps_per_hour"], rel=0.5), out


def test_a_resume_cuts_the_trace_back_to_the_checkpoint_and_continues_it(tmp_path):
    run_dir = tmp_path / "run"
    first = ["steps=3", "batch_groups=2", "group_size=2", "max_new_tokens=4"]
    run_within(make_job(run_dir, first), 600)
    path = run_dir / TRACE_FILE
    saved = path.read_text()
    path.write_text(saved + json.dumps({"event": "drop", "t": 99.0, "uid": 12345}) + "\n")  # after the save
    summary = run_within(make_job(run_dir, ["steps=5", "batch_groups=2", "group_size=2", "max_new_tokens=4",
                                            "resume=true"]), 600)
    assert summary["audit_ok"]
    text = path.read_text()
    assert text.startswith(saved) and "12345" not in text
    events = list(read_run_trace(path))
    assert [e["step"] for e in events if e["event"] == "run"] == [0, 3]
    assert [e["step"] for e in events if e["event"] == "train"] == [0, 1, 2, 3, 4]
    times = [e["t"] for e in events if e["event"] == "train"]
    assert times == sorted(times)  # run seconds continue across the restart
