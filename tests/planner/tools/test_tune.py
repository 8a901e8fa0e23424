"""`python -m planner.tune`: each target's rule, determinism, budgets, bad input, and a case with a known answer."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from planner.ledger_audit import audit
from planner.tools.simulate import SimulateConfig, run_simulation
from planner.tools.tune import TuneConfig, choose, compose, prepare, rank, split, tune
from tests.helpers import REPO

# A trainer-bound cluster: four workers, B=32; a step costs ~80 s, generating its batch ~60 s.
TRAINER_BOUND = ["steps=40", "sim.trainer.c0=60"]


def report(*overrides: str) -> dict:
    return tune(*prepare(list(overrides)))


def row(i, tps, stale, *, eta=2, max_stale=None, deadlock=False):
    return {"i": i, "eta": eta, "tokens_per_s": tps, "mean_token_staleness": stale,
            "max_token_staleness": eta if max_stale is None else max_stale, "deadlock": deadlock}


def test_max_throughput_ranks_by_trained_tokens_per_second_then_lower_staleness():
    rows = [row(0, 100.0, 1.9), row(1, 120.0, 1.9), row(2, 120.0, 1.2), row(3, 119.0, 0.5)]
    ranked = rank(rows, TuneConfig(target="max_throughput"), eta=2)
    assert [r["i"] for r in ranked] == [2, 1, 3, 0]


def test_min_staleness_takes_the_freshest_at_the_threshold_of_the_best_throughput():
    rows = [row(0, 100.0, 1.9), row(1, 98.0, 1.2), row(2, 97.9, 0.3), row(3, 99.0, 1.2)]
    ranked = rank(rows, TuneConfig(target="min_staleness", threshold=0.98), eta=2)
    assert [r["i"] for r in ranked][:3] == [3, 1, 0]  # 97.9 < 0.98·100: not eligible however fresh
    assert ranked[3]["i"] == 2


def test_a_deadlocked_or_bound_breaking_candidate_never_wins():
    rows = [row(0, 500.0, 0.1, deadlock=True), row(1, 400.0, 1.0, eta=2, max_stale=3), row(2, 300.0, 1.0, eta=3),
            row(3, 10.0, 2.0)]
    for target in ("max_staleness", "max_throughput", "min_staleness"):
        assert [r["i"] for r in rank(rows, TuneConfig(target=target), eta=2)] == [3]


def test_the_max_staleness_target_searches_only_the_given_eta():
    r = report("target=max_staleness", "eta=1", "steps=5", "batch_groups=4", "space.caps=[null]", "budget=10", "jobs=1")
    assert {row["eta"] for row in r["top"]} == {1} and r["runs"] == 3  # base (η=2) + partial + drain at η=1


def test_min_staleness_finds_a_cap_that_trains_fresher_tokens_at_the_same_throughput(tmp_path):
    """Docs/tuning.md's claim: a trainer-bound greedy run sits at staleness ≈ η; the tuner's cap does not."""
    r = report("target=min_staleness", "eta=2", "max_staleness=2", "space.sync_mode=[partial]", "jobs=1", *TRAINER_BOUND)
    base, best = r["base"], r["recommended"]
    assert base["mean_token_staleness"] > 1.8  # the greedy quota: nearly every token at η
    assert best["tokens_per_s"] >= 0.98 * base["tokens_per_s"]
    assert best["mean_token_staleness"] < base["mean_token_staleness"] - 0.5
    assert best["eta"] == 2 and best["cap_key"] == "max_untrained_groups" and best["cap_groups"] < 32 * 3
    # Still strict and drop-free: replay the recommendation and audit its ledger.
    cfg = compose(["max_staleness=2", f"policy.max_untrained_groups={best['cap_groups']}", *TRAINER_BOUND])
    _, base_map = split(cfg)
    run = run_simulation(SimulateConfig.from_mapping(base_map), tmp_path, plots=False)
    verdict = audit(tmp_path, 2)
    assert verdict.ok and verdict.groups_dropped == 0 and not verdict.lost, verdict.verdict()
    assert run.summary["mean_token_staleness"] == pytest.approx(best["mean_token_staleness"])


def test_max_throughput_on_a_generation_bound_cluster_takes_the_largest_eta():
    # One slow worker: generation is the bottleneck, so a looser bound admits more and trains more.
    r = report("target=max_throughput", "eta=2", "steps=20", "batch_groups=8", "sim.workers.num_workers=1",
               "sim.trainer.c0=1", "space.caps=[null]", "space.sync_mode=[partial]", "jobs=1")
    assert r["recommended"]["eta"] == 2
    by_eta = {x["eta"]: x["tokens_per_s"] for x in r["top"]}
    assert by_eta[2] > by_eta[1] > by_eta[0]


def test_same_inputs_give_the_same_recommendation_whatever_the_number_of_processes():
    over = ["target=min_staleness", "eta=2", "steps=10", "batch_groups=4", "budget=9", "search_seed=3"]
    one, two = report(*over, "jobs=1"), report(*over, "jobs=2")
    assert one == two and one["search"] == "random" and one["runs"] == 9


def test_a_grid_larger_than_the_budget_is_sampled_and_keeps_the_base():
    points = list(range(20))
    tcfg = TuneConfig(budget=12, seeds=[0, 1])
    picked = choose(tcfg, points, runs_each=2)
    assert len(picked) == 5 and picked == sorted(picked)  # 12 runs // 2 seeds − the base's
    assert picked == choose(tcfg, points, runs_each=2)
    assert choose(TuneConfig(budget=100), points, runs_each=1) == points


def test_the_recommended_overrides_compose_into_a_valid_training_config():
    from jaxrl_async.job.setup import typed_config
    from tests.helpers.train_runs import compose_train

    r = report("target=min_staleness", "eta=2", "max_staleness=2", "space.sync_mode=[drain]", "jobs=1",
               *TRAINER_BOUND)
    setup = typed_config(compose_train(r["recommended"]["train_overrides"]))
    assert setup.run.max_staleness == 2 and setup.run.batch_groups == 32
    assert setup.policy_overrides["max_untrained_groups"] == r["recommended"]["cap_groups"]
    assert setup.engine.sync_mode == "drain" and setup.engine.num_slots == r["recommended"]["max_concurrency"]
    assert r["command"].startswith("python -m jaxrl_async.train policy=lookahead max_staleness=2")


def cli(*args):
    return subprocess.run([sys.executable, "-m", "planner.tune", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=120)


@pytest.mark.parametrize(
    ("arg", "message"),
    [
        ("target=fastest", "error: target='fastest': must be one of max_staleness, max_throughput, min_staleness"),
        ("budget=0", "error: budget=0: must be an integer >= 1"),
        ("eta=-1", "error: eta=-1: must be an integer >= 0"),
        ("space.cap_key=bogus", "error: space.cap_key='bogus': not a parameter of policy 'lookahead'"),
        ("space.etas=[3]", "error: space.etas=[3]: must be <= eta (eta=2)"),
        ("space.caps=[0]", "error: space.caps=0: entries must be multiples of B > 0"),
        ("sim.workers.sync_mode=sideways", "error: sim.workers.sync_mode='sideways'"),
        ("no_such_key=1", "error: no_such_key: unknown key (known: "),
        ("budgt=3", "error: budgt: unknown key (did you mean budget?)"),
        ("sim.trainer.c0=abc", "error: sim.trainer.c0='abc': must be a number"),
    ],
)
def test_bad_input_is_one_line_and_exit_1(arg, message):
    p = cli("steps=3", "batch_groups=2", arg)
    assert p.returncode == 1, p.stdout
    assert p.stderr.strip().splitlines() == [p.stderr.strip()] and p.stderr.startswith(message), p.stderr


def test_json_output_names_the_recommendation_and_its_train_command():
    p = cli("steps=5", "batch_groups=2", "eta=1", "output=json", "budget=6", "jobs=1")
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert out["runs"] <= 6 and out["recommended"] is not None
    assert out["command"] == "python -m jaxrl_async.train " + " ".join(out["recommended"]["train_overrides"])


def test_throughput_is_compared_in_trained_tokens_not_steps_when_b_varies():
    # The trainer's fixed cost dominates: B=16 trains about twice the tokens per second at fewer steps/h.
    r = report("target=max_throughput", "eta=1", "steps=20", "space.batch_groups=[8,16]", "space.caps=[null]",
               "space.sync_mode=[partial]", "sim.trainer.c0=60", "jobs=1")
    rows = {x["batch_groups"]: x for x in r["top"] if x["eta"] == 1}
    assert rows[8]["steps_per_hour"] > rows[16]["steps_per_hour"]
    assert r["recommended"]["batch_groups"] == 16 and rows[16]["tokens_per_s"] > rows[8]["tokens_per_s"]


def test_a_calibration_sets_the_base_and_each_candidate_keeps_its_own_engine_slots(tmp_path):
    """The calibration's 8 slots per worker (one group) is the base; a candidate with 256 slots really runs with them."""
    calibration = tmp_path / "calibration.yaml"
    calibration.write_text("sim:\n  workers:\n    max_concurrency: 8\n")
    r = report(f"calibration={calibration}", "steps=5", "batch_groups=4", "space.caps=[null]",
               "space.sync_mode=[partial]", "space.max_concurrency=[8,256]", "space.etas=[2]", "space.batch_groups=[4]",
               "jobs=1")
    by_slots = {row["max_concurrency"]: row for row in r["top"]}
    assert r["base"]["max_concurrency"] == 8  # the calibration's, not the sim file's 256
    assert by_slots[8]["tokens_per_s"] == pytest.approx(r["base"]["tokens_per_s"])
    assert by_slots[256]["tokens_per_s"] > 1.5 * by_slots[8]["tokens_per_s"]  # not overwritten by the calibration


def test_a_calibrations_compile_warm_up_is_left_out_unless_the_command_line_sets_it(tmp_path):
    """Every candidate would pay the replay's warm-up alike: the tuner ranks the steady rate."""
    calibration = tmp_path / "calibration.yaml"
    calibration.write_text("sim:\n  workers: {compile_s: 2.0, t_sync: 0.5}\n  trainer: {compile_s: 3.0}\n")
    _, base = prepare([f"calibration={calibration}"])
    assert base["sim"]["workers"]["compile_s"] == base["sim"]["trainer"]["compile_s"] == 0.0
    assert base["sim"]["workers"]["t_sync"] == 0.5  # the rest of the calibration stays
    _, base = prepare([f"calibration={calibration}", "sim.trainer.compile_s=4.0"])
    assert (base["sim"]["workers"]["compile_s"], base["sim"]["trainer"]["compile_s"]) == (0.0, 4.0)
