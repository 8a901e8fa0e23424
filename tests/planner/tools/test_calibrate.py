"""`python -m planner.calibrate`: recovers a known cost model from a trace, writes a calibration
the simulator takes (merged under command-line sim.* overrides), and refuses bad traces in one line."""

import json
import subprocess
import sys

import numpy as np
import pytest
import yaml

from planner.configs import build
from planner.sim import SimConfig
from planner.tools.calibrate import calibrate, main, nnls
from planner.run_trace import TraceWriter
from planner.tools.simulate import SimulateConfig, sim_overrides

ALPHA, BETA, PREFILL, C0, C1, LAG, T_SYNC = 0.002, 1e-4, 5e-5, 0.05, 2e-5, 0.01, 0.003
SPEEDS = (1.0, 0.5)


def synthetic_run(run_dir, steps=12, *, colocated=None, slowdown=0.0, trainer_noise=0.0, engine_keys=None):
    """A trace whose every time follows the simulator's cost model exactly; with `slowdown`, it
    also has iterations during trainer steps whose decode part is (1 + slowdown)× slower, and
    `colocated` goes into the `run` line (None: left out, as in traces before the field); with
    `trainer_noise`, each trainer step takes up to that many seconds more, at random; `engine_keys`
    replace the `run` line's sync mode (and add its keys)."""
    run_dir.mkdir()
    rng, noise = np.random.default_rng(0), np.random.default_rng(1)
    w = TraceWriter(run_dir / "trace.jsonl")
    w.write("run", 0.0, step=0, policy="lookahead", max_staleness=1, batch_groups=4, group_size=2,
            admission_window=8, max_new_tokens=8, engine="jax", workers=2, slots=16, kv_tokens=2048,
            **(engine_keys or {"sync_mode": "partial"}), **({} if colocated is None else {"colocated": colocated}))
    t = 0.0
    for k in range(steps):
        calls = []
        for worker, speed in enumerate(SPEEDS):
            for active in (2, 6, 16):
                steps_, prefill = 8, int(rng.integers(0, 100))
                s = (ALPHA * steps_ + BETA * steps_ * active + PREFILL * prefill) / speed
                calls.append((worker, s, steps_, steps_ * active, prefill, False, False))
                if slowdown:
                    decode = (ALPHA * steps_ + BETA * steps_ * active) * (1 + slowdown)
                    calls.append((worker, (decode + PREFILL * prefill) / speed, steps_, steps_ * active, prefill,
                                  False, True))
        calls.append((0, 5.0, 8, 16, 0, True, False))  # a compiling iteration: left out
        tokens, prompt = int(rng.integers(100, 2000)), int(rng.integers(50, 500))
        duration = C0 + C1 * (tokens + prompt) + (3.0 if k == 0 else 0.0)  # step 0 compiles
        duration += trainer_noise * noise.random()
        w.write("train", t, step=k, start=t, end=t + duration, groups=4, tokens=tokens, prompt_tokens=prompt)
        t += duration
        w.write("publish", t, version=k + 1)
        for worker in range(2):
            w.write("load", t + LAG + 0.001 * worker, version=k + 1, worker=worker, s=T_SYNC)
        w.write("synced", t + LAG + 0.002 + T_SYNC, version=k + 1)
        w.decode(t, calls)
        for uid in range(4 * k, 4 * k + 4):
            w.write("admit", t, uid=uid, attempt=0, prompt_id=f"p{uid}", prompt_tokens=20, version=k + 1)
            w.write("finish", t + 0.01, uid=uid, attempt=0, lengths=[3, 8])
        t += 0.05
    w.close()
    return run_dir


def test_the_fit_recovers_the_cost_model_that_made_the_trace(tmp_path):
    cal = calibrate(synthetic_run(tmp_path / "run"))
    w, tr = cal["sim"]["workers"], cal["sim"]["trainer"]
    mean_speed = np.mean(SPEEDS)  # speeds are relative: the coefficients are at their mean
    assert w["speeds"] == pytest.approx([s / mean_speed for s in SPEEDS], rel=1e-3)
    assert (w["decode_alpha"], w["decode_beta"], w["prefill_per_token"]) == pytest.approx(
        (ALPHA / mean_speed, BETA / mean_speed, PREFILL / mean_speed), rel=1e-3)
    assert (tr["c0"], tr["c1"], tr["wait_sync"]) == (pytest.approx(C0, rel=1e-3), pytest.approx(C1, rel=1e-3), True)
    assert w["load_lag"] == pytest.approx(LAG + 0.0005, abs=1e-6)  # the median over both workers
    assert w["t_sync"] == pytest.approx(T_SYNC)
    assert (w["num_workers"], w["max_concurrency"], w["kv_capacity"], w["sync_mode"]) == (2, 16, 2048, "partial")
    assert cal["sim"]["admission_window"] == 8
    assert cal["fit"]["decode"]["left_out"] == 12 and cal["fit"]["trainer"]["left_out"] == 1
    assert cal["fit"]["decode"]["rms_s"] < 1e-9 and cal["fit"]["trainer"]["r2"] == pytest.approx(1.0)


def test_a_colocated_runs_slowdown_during_trainer_steps_is_recovered_and_the_rest_fitted_without_it(tmp_path):
    cal = calibrate(synthetic_run(tmp_path / "run", colocated=True, slowdown=0.7))
    w, fit = cal["sim"]["workers"], cal["fit"]
    assert w["colocated_slowdown"] == pytest.approx(0.7, rel=1e-3)
    mean_speed = np.mean(SPEEDS)
    assert (w["decode_alpha"], w["decode_beta"], w["prefill_per_token"]) == pytest.approx(
        (ALPHA / mean_speed, BETA / mean_speed, PREFILL / mean_speed), rel=1e-3)
    assert w["speeds"] == pytest.approx([s / mean_speed for s in SPEEDS], rel=1e-3)
    assert fit["decode"]["rms_s"] < 1e-9  # the slowed lines are not in the decode fit
    assert fit["colocation"] == {"colocated": True, "lines_in_steps": 12 * 6, "lines_outside": 12 * 6, "fitted": True}
    assert build(SimConfig, cal["sim"], "sim").workers.colocated_slowdown == pytest.approx(0.7, rel=1e-3)


@pytest.mark.parametrize("colocated", [False, None])
def test_an_engine_on_its_own_devices_gets_no_slowdown(tmp_path, colocated):
    cal = calibrate(synthetic_run(tmp_path / "run", colocated=colocated, slowdown=0.7))
    assert cal["sim"]["workers"]["colocated_slowdown"] == 0.0
    assert cal["fit"]["colocation"]["fitted"] is False and cal["fit"]["colocation"]["lines_in_steps"] == 12 * 6
    assert cal["fit"]["decode"]["rms_s"] > 1e-4  # every iteration fitted alike: the slowed ones do not fit


def test_a_pinned_runs_resident_adapter_versions_become_the_simulators_resident_versions(tmp_path):
    pinned = calibrate(synthetic_run(tmp_path / "pinned", engine_keys={"sync_mode": "pinned", "adapter_versions": 3}))
    assert (pinned["sim"]["workers"]["sync_mode"], pinned["sim"]["workers"]["resident_versions"]) == ("pinned", 3)
    assert build(SimConfig, pinned["sim"], "sim").workers.resident_versions == 3
    partial = calibrate(synthetic_run(tmp_path / "partial"))
    assert "resident_versions" not in partial["sim"]["workers"]


def test_nnls_keeps_every_coefficient_non_negative():
    x = np.array([[1.0, 1.0], [1.0, 2.0], [1.0, 3.0]])
    y = np.array([3.0, 2.0, 1.0])  # plain least squares: slope -1
    assert np.linalg.lstsq(x, y, rcond=None)[0][1] < 0
    coef = nnls(x, y)
    assert coef.min() >= 0 and coef == pytest.approx([2.0, 0.0])


def test_the_cli_writes_a_calibration_that_the_simulator_takes_under_command_line_overrides(tmp_path, capsys):
    run_dir = synthetic_run(tmp_path / "run")
    assert main([str(run_dir)]) == 0
    out = capsys.readouterr().out
    assert "decode:" in out and "trainer:" in out and "RMS residual" in out
    path = run_dir / "calibration.yaml"
    cal = yaml.safe_load(path.read_text())
    base = {"policy": {"name": "lookahead"}, "max_staleness": 1, "batch_groups": 4, "group_size": 2, "steps": 5,
            "seed": 0, "workload": {"name": "trace", "path": str(run_dir / "trace.jsonl"), "prompt_tokens": 256},
            "sim": {"workers": {"num_workers": 4, "t_sync": 2.0, "max_concurrency": 32}, "trainer": {"c0": 5.0}},
            "calibration": str(path)}
    config = SimulateConfig.from_mapping(base, sim_overrides(["calibration=x", "sim.workers.t_sync=0.5", "steps=5"]))
    assert config.sim.workers.num_workers == 2 and config.sim.workers.max_concurrency == 16  # the calibration's
    assert config.sim.trainer.c0 == cal["sim"]["trainer"]["c0"] and config.sim.trainer.wait_sync
    assert config.sim.workers.t_sync == 0.5  # the command line wins
    plain = SimulateConfig.from_mapping({**base, "calibration": None})
    assert plain.sim.workers.num_workers == 4 and plain.sim.trainer.c0 == 5.0


@pytest.mark.parametrize("content, message", [
    (None, "no such trace file"),
    ('{"event": "run"\n' + json.dumps({"event": "run", "t": 0}) + "\n", r"trace.jsonl:1: not valid JSON"),
    (json.dumps({"event": "run", "t": 0, "step": 0, "group_size": 2, "workers": 1, "slots": 4}) + "\n",
     "no train lines"),
    ("", "no run lines"),
])
def test_a_missing_torn_or_empty_trace_is_one_line_and_exit_1(tmp_path, capsys, content, message):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    if content is not None:
        (run_dir / "trace.jsonl").write_text(content)
    assert main([str(run_dir)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and err.count("\n") == 1, err
    assert not (run_dir / "calibration.yaml").exists()


def test_a_trace_without_engine_timings_names_what_is_missing(tmp_path, capsys):
    run_dir = synthetic_run(tmp_path / "run")
    lines = [line for line in (run_dir / "trace.jsonl").read_text().splitlines() if '"decode"' not in line]
    (run_dir / "trace.jsonl").write_text("\n".join(lines) + "\n")
    assert main([str(run_dir)]) == 1
    assert "no decode lines (engine=jax reports no iteration timings)" in capsys.readouterr().err


@pytest.mark.parametrize("text, message", [
    ("sim: [1, 2]\n", "needs a `sim:` mapping"),
    ("sim: {workers: {num_workers: 2}}\nextra: 1\n", "extra: unknown key"),
    ("sim: {workers: {bogus: 1}}\n", "sim.workers.bogus: unknown key"),
    ("sim: {\n", "not valid YAML"),
])
def test_a_bad_calibration_file_is_a_one_line_error_naming_it(tmp_path, text, message):
    path = tmp_path / "cal.yaml"
    path.write_text(text)
    base = {"policy": {"name": "lookahead"}, "max_staleness": 1, "batch_groups": 4, "group_size": 2, "steps": 5,
            "seed": 0, "workload": {"name": "lognormal"}, "sim": {}, "calibration": str(path)}
    with pytest.raises(ValueError, match=message) as e:
        SimulateConfig.from_mapping(base)
    assert "\n" not in str(e.value)


def test_the_stable_command_name_forwards_to_the_tool_and_its_exit_status(tmp_path):
    """`python -m planner.calibrate` is a shim over `planner.tools.calibrate.main`."""
    p = subprocess.run([sys.executable, "-m", "planner.calibrate", str(tmp_path)], capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 1 and p.stderr.startswith("error: ") and len(p.stderr.strip().splitlines()) == 1, p.stderr


# ---------------------------------------------------------------- warnings, labels, warm-up, replay
def test_a_decode_fit_on_one_line_warns_naming_its_coefficients_and_the_count(tmp_path, capsys):
    run_dir = synthetic_run(tmp_path / "run", colocated=True, slowdown=0.7)
    lines = (run_dir / "trace.jsonl").read_text().splitlines()
    outside = [i for i, line in enumerate(lines) if '"decode"' in line and '"train"' not in line
               and '"compile"' not in line]
    assert len(outside) > 1  # the fit rested on many lines before
    keep = set(outside[:1])
    (run_dir / "trace.jsonl").write_text("\n".join(line for i, line in enumerate(lines)
                                                   if i not in outside or i in keep) + "\n")
    assert main([str(run_dir)]) == 0
    err = capsys.readouterr().err
    warning = [line for line in err.splitlines() if line.startswith("warning: decode")]
    assert len(warning) == 1, err
    assert "sim.workers.decode_alpha, sim.workers.decode_beta, sim.workers.prefill_per_token" in warning[0]
    assert "fitted to 1 line " in warning[0]
    assert yaml.safe_load((run_dir / "calibration.yaml").read_text())["fit"]["warnings"]


def test_a_fit_that_explains_less_than_half_of_its_lines_spread_warns_in_one_line_naming_it(tmp_path, capsys):
    run_dir = synthetic_run(tmp_path / "run", colocated=True, slowdown=0.7, trainer_noise=0.3)
    assert main([str(run_dir)]) == 0
    err = capsys.readouterr().err
    warning = [line for line in err.splitlines() if line.startswith("warning: ")]
    assert len(warning) == 1 and warning[0].startswith("warning: trainer: R² "), err  # decode is exact: no warning
    assert "< 0.5: sim.trainer.c0, sim.trainer.c1 explain little" in warning[0]
    fit = yaml.safe_load((run_dir / "calibration.yaml").read_text())["fit"]
    assert fit["trainer"]["r2"] < 0.5 and fit["decode"]["r2"] == pytest.approx(1.0)
    assert fit["warnings"] == [warning[0].removeprefix("warning: ")]


def test_steps_that_differ_by_rounding_only_have_no_r2_and_no_warning(tmp_path):
    from tests.helpers import training_run as R

    cal = calibrate(R.write_training_run(tmp_path / "run"))  # every batch costs the same
    assert cal["fit"]["trainer"]["r2"] is None and cal["fit"]["trainer"]["rms_s"] < 1e-9
    assert cal["fit"]["warnings"] == []


def test_a_fit_on_enough_lines_warns_nothing(tmp_path, capsys):
    assert main([str(synthetic_run(tmp_path / "run", colocated=True, slowdown=0.7))]) == 0
    assert "warning" not in capsys.readouterr().err


def test_in_step_lines_are_reported_as_in_step_iterations_not_as_compiling(tmp_path, capsys):
    # Not colocated: the 72 in-step lines are fitted with the rest; only the 12 compiling ones are left out.
    assert main([str(synthetic_run(tmp_path / "run", colocated=False, slowdown=0.7))]) == 0
    decode = capsys.readouterr().out.splitlines()[1]
    assert "144 lines (72 of them in trainer steps, fitted alike; 12 compiling left out)" in decode, decode
    assert main([str(synthetic_run(tmp_path / "coloc", colocated=True, slowdown=0.7))]) == 0
    decode = capsys.readouterr().out.splitlines()[1]
    assert "72 lines (outside trainer steps; the 72 in-step lines fit the colocation slowdown; 12 compiling " \
           "left out)" in decode, decode


def test_the_warm_up_the_fit_leaves_out_becomes_the_compile_time_of_the_replay(tmp_path):
    from tests.helpers import training_run as R

    cal = calibrate(R.write_training_run(tmp_path / "run"))
    assert cal["sim"]["workers"]["compile_s"] == pytest.approx(R.DECODE_COMPILE, rel=1e-3)
    assert cal["sim"]["trainer"]["compile_s"] == pytest.approx(R.TRAIN_COMPILE, rel=1e-3)
    assert cal["fit"]["compile"] == {"decode_lines": 1, "trainer_steps": 1}


def test_the_printed_replay_command_replays_the_run_and_matches_its_steps_per_hour(tmp_path, capsys):
    """The command replays the run's own policy (and its parameters), η, B, n and steps; both
    summaries' steady-state steps/h agree, and so do the whole-run figures, warm-up included."""
    import shlex
    import subprocess
    import sys

    from tests.helpers import REPO
    from tests.helpers import training_run as R

    run_dir = R.write_training_run(tmp_path / "run")
    assert main([str(run_dir)]) == 0
    replay = [line for line in capsys.readouterr().out.splitlines() if line.startswith("replay: ")]
    assert len(replay) == 1
    argv = shlex.split(replay[0].removeprefix("replay: "))
    assert argv[:3] == ["python", "-m", "planner.simulate"]
    p = subprocess.run([sys.executable, *argv[1:]], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert "warning" not in p.stderr, p.stderr  # the calibrated run's own context: nothing differs
    assert p.stdout.strip().splitlines()[-1] == f"wrote {run_dir / 'replay'}"
    real = json.loads((run_dir / "summary.json").read_text())
    sim = json.loads((run_dir / "replay" / "summary.json").read_text())
    assert (sim["policy"], sim["max_staleness"], sim["steps"]) == ("lookahead", R.ETA, R.STEPS)
    assert sim["groups_trained"] == R.B * R.STEPS and sim["trajectories_trained"] == R.B * R.N * R.STEPS
    assert sim["policy_params"]["max_untrained_groups"] == R.POLICY_PARAMS["max_untrained_groups"]
    assert sim["steps_per_hour_steady"] == pytest.approx(real["steps_per_hour_steady"], rel=0.01)
    assert sim["steps_per_hour"] == pytest.approx(real["steps_per_hour"], rel=0.02)
    # non-trivial: the warm-up halves the whole-run figure
    assert real["steps_per_hour"] < 0.6 * real["steps_per_hour_steady"]


def test_the_replay_takes_the_policy_parameters_the_run_set_and_not_those_left_to_the_policy(tmp_path):
    from planner.tools.calibrate import policy_params

    path = tmp_path / "config.yaml"
    path.write_text("policy:\n  name: lookahead\n  predictor: ???\n  max_untrained_groups: 4\n  kv_token_budget: null\n")
    assert policy_params(path) == {"max_untrained_groups": 4, "kv_token_budget": None}  # null is a value
    path.write_text("policy: {name: lookahead, predictor: null, max_untrained_groups: 4}\n")  # before ???
    assert policy_params(path) == {"max_untrained_groups": 4}
    assert policy_params(tmp_path / "missing.yaml") == {}
