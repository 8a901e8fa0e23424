"""`planner.calibrate`'s tail terms: the acceptance, draft cost and migration cost that made a
synthetic trace are recovered, and a trace without them calibrates with no new key."""

import dataclasses

import numpy as np
import pytest

from planner.configs import build
from planner.sim.config import SimConfig, WorkerConfig
from planner.tools.calibrate import calibrate
from planner.tools.calibrate_tail import acceptance_from_kept
from planner.run_trace import TraceWriter

ALPHA, BETA, PREFILL, C0, C1 = 0.002, 1e-4, 5e-5, 0.05, 2e-5
A, K, DRAFT_COST, MIGRATION_S = 0.6, 4, 0.3, 0.02
KEPT = sum(A ** i for i in range(1, K + 1))  # expected drafts kept per verification


def tail_run(run_dir, *, speculate=True, migrate=True, tokens_in_run_line=True):
    """One worker; each step drains plain iterations at three active counts and, with `speculate`,
    speculating ones at two (every step drafts K a sequence and keeps KEPT of them on average);
    with `migrate`, a move a step whose seconds are MIGRATION_S plus the target's re-prefill."""
    rng = np.random.default_rng(0)
    w = TraceWriter(run_dir / "trace.jsonl")
    spec = {"speculation": {"when": "critical", "tokens": K, "max_active": 8}} if tokens_in_run_line else {}
    w.write("run", 0.0, step=0, policy="lookahead", max_staleness=1, batch_groups=4, group_size=2,
            admission_window=8, max_new_tokens=8, engine="jax", workers=2, slots=16, kv_tokens=2048,
            sync_mode="partial", **spec)
    t = 0.0
    for k in range(10):
        calls = []
        for active in (2, 6, 16):
            prefill = int(rng.integers(0, 100))
            calls.append((0, ALPHA * 8 + BETA * 8 * active + PREFILL * prefill, 8, 8 * active, prefill, False, False))
        if speculate:
            for active in (1, 3):
                steps, prefill = 100, int(rng.integers(0, 100))
                drafted, accepted = K * steps * active, round(KEPT * steps * active)
                s = ALPHA * steps * (1 + DRAFT_COST * K) + BETA * steps * active + PREFILL * prefill
                calls.append((1, s, steps, steps * active + accepted, prefill, False, False, drafted, accepted))
        tokens = int(rng.integers(100, 2000))
        w.write("train", t, step=k, start=t, end=t + C0 + C1 * tokens, groups=4, tokens=tokens, prompt_tokens=0)
        t += C0 + C1 * tokens
        w.write("publish", t, version=k + 1)
        w.decode(t, calls)
        if migrate:
            prefix = int(rng.integers(10, 500))
            w.write("migrate", t, uid=k, to=1, s=MIGRATION_S + PREFILL * prefix, prefill_tokens=prefix, **{"from": 0})
        t += 0.05
    w.close()
    return run_dir


def fitted(cal):
    """The tail terms as dotted sim keys, wherever this simulator puts them."""
    if "tail_terms" in cal["fit"]:
        return cal["fit"]["tail_terms"]
    w = cal["sim"]["workers"]
    out = {f"sim.workers.speculation.{k}": v for k, v in w.get("speculation", {}).items()}
    if "migration_s" in w:
        out["sim.workers.migration_s"] = w["migration_s"]
    return out


def test_acceptance_is_the_per_token_probability_whose_expected_kept_share_was_measured():
    assert acceptance_from_kept(KEPT / K, K) == pytest.approx(A, abs=1e-9)
    assert acceptance_from_kept(0.0, K) == 0.0 and acceptance_from_kept(1.0, K) == 1.0
    assert acceptance_from_kept(0.5, 1) == pytest.approx(0.5)  # k = 1: the share is the probability


def test_the_fit_recovers_the_acceptance_draft_cost_and_migration_cost_that_made_the_trace(tmp_path):
    (tmp_path / "run").mkdir()
    cal = calibrate(tail_run(tmp_path / "run"))
    got = fitted(cal)
    assert got["sim.workers.speculation.acceptance"] == pytest.approx(A, abs=2e-3)  # accepted is rounded
    assert got["sim.workers.speculation.draft_cost"] == pytest.approx(DRAFT_COST, rel=1e-2)
    assert (got["sim.workers.speculation.when"], got["sim.workers.speculation.tokens"],
            got["sim.workers.speculation.max_active"]) == ("critical", K, 8)
    assert got["sim.workers.migration_s"] == pytest.approx(MIGRATION_S, rel=1e-3)
    # the plain cost model is fitted to the plain iterations alone (a speculating one would bias it)
    w = cal["sim"]["workers"]
    assert (w["decode_alpha"], w["decode_beta"]) == pytest.approx((ALPHA, BETA), rel=1e-3)
    assert cal["fit"]["speculation"]["lines"] == 20 and cal["fit"]["migration"]["moves"] == 10
    build(SimConfig, cal["sim"], "sim")  # whatever the simulator, the calibration stays buildable


def test_without_k_in_the_run_line_the_kept_share_is_reported_and_nothing_is_fitted(tmp_path):
    (tmp_path / "run").mkdir()
    cal = calibrate(tail_run(tmp_path / "run", migrate=False, tokens_in_run_line=False))
    assert cal["fit"]["speculation"]["kept_share"] == pytest.approx(KEPT / K, abs=1e-3)
    assert fitted(cal) == {}
    assert any("speculation.tokens" in warning for warning in cal["fit"]["warnings"])


def test_a_trace_without_speculation_or_migration_calibrates_with_no_new_key(tmp_path):
    (tmp_path / "run").mkdir()
    cal = calibrate(tail_run(tmp_path / "run", speculate=False, migrate=False))
    assert fitted(cal) == {}
    assert not {"speculation", "migration", "tail_terms"} & set(cal["fit"])
    assert not {"speculation", "migration_s"} & set(cal["sim"]["workers"])
    assert not [w for w in cal["fit"]["warnings"] if "speculation" in w or "migration" in w]


def test_the_terms_go_into_the_simulators_keys_when_it_has_them(tmp_path):
    fields = {f.name for f in dataclasses.fields(WorkerConfig)}
    (tmp_path / "run").mkdir()
    cal = calibrate(tail_run(tmp_path / "run"))
    if not {"speculation", "migration_s"} <= fields:  # before branch tail-sim: kept apart, named by key
        assert "tail_terms" in cal["fit"] and "speculation" not in cal["sim"]["workers"]
        return
    workers = build(SimConfig, cal["sim"], "sim").workers
    assert workers.speculation.acceptance == pytest.approx(A, abs=2e-3)
    assert workers.migration_s == pytest.approx(MIGRATION_S, rel=1e-3)
