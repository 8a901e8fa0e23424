"""`python -m planner.plots RUN_DIR`: a simulated run and a training run drawn by the same code;
a training run's active sequences come from its trace and its compile is drawn apart."""

import json
import shutil

import pytest

import planner.policies.lookahead  # noqa: F401  (registers lookahead)
from planner.sim.metrics import read_steps
from planner.tools.plots import compiling_steps, main, run_plots, trace_active
from planner.tools.simulate import SimulateConfig, run_simulation
from tests.helpers import training_run as R


@pytest.fixture
def simulated(tmp_path):
    config = SimulateConfig.from_mapping({
        "policy": {"name": "lookahead"}, "max_staleness": 1, "batch_groups": 4, "group_size": 2, "steps": 8,
        "seed": 0, "workload": {"name": "lognormal"}, "sim": {}, "calibration": None})
    run_simulation(config, tmp_path / "sim", plots=False)
    return tmp_path / "sim"


def test_the_cli_draws_a_simulated_run_into_its_directory_and_says_what_it_wrote(simulated, capsys):
    assert not (simulated / "utilisation.png").exists()
    assert main([str(simulated)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out == [f"wrote {simulated / 'staleness_hist.png'}", f"wrote {simulated / 'utilisation.png'}"]
    assert all((simulated / name).stat().st_size > 0 for name in ("staleness_hist.png", "utilisation.png"))


def test_the_cli_draws_a_training_run_into_out(tmp_path, capsys):
    run_dir = R.write_training_run(tmp_path / "train")
    assert main([str(run_dir), "--out", str(tmp_path / "plots")]) == 0
    assert capsys.readouterr().out.splitlines() == [f"wrote {tmp_path / 'plots' / n}"
                                                    for n in ("staleness_hist.png", "utilisation.png")]
    assert (tmp_path / "plots" / "utilisation.png").stat().st_size > 0


def test_a_directory_without_a_run_is_one_line_and_exit_1(tmp_path, capsys):
    assert main([str(tmp_path)]) == 1
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.startswith("error: ") and captured.err.count("\n") == 1
    assert "no run here" in captured.err and not list(tmp_path.iterdir())


def test_a_training_runs_active_sequences_come_from_its_trace_not_from_the_idle_step_ends(tmp_path):
    run_dir = R.write_training_run(tmp_path / "train")
    rows = read_steps(run_dir / "metrics.jsonl")
    assert all(r["gen_active"] == [0] for r in rows)  # sampled at step ends: the engine is idle there
    (times, active), = trace_active(run_dir / "trace.jsonl")
    assert len(times) == len(active) >= R.STEPS and max(active) > 0  # one value per step end with iterations
    # The trace changes what is drawn: the same run without it draws another picture.
    run_plots(run_dir, tmp_path / "with")
    bare = tmp_path / "bare"
    shutil.copytree(run_dir, bare)
    (bare / "trace.jsonl").unlink()
    run_plots(bare, tmp_path / "without")
    assert (tmp_path / "with" / "utilisation.png").read_bytes() != (tmp_path / "without" / "utilisation.png").read_bytes()


def test_without_iteration_timings_the_active_sequences_count_started_groups_until_they_finish(tmp_path):
    run_dir = R.write_training_run(tmp_path / "train")
    lines = (run_dir / "trace.jsonl").read_text().splitlines()
    (run_dir / "trace.jsonl").write_text("\n".join(x for x in lines if '"decode"' not in x) + "\n")
    (times, active), = trace_active(run_dir / "trace.jsonl")
    assert max(active) == R.B * R.N and active[-1] == 0  # a step's B groups of N samples run together
    assert times == sorted(times)


def test_the_training_runs_compile_step_is_told_apart_and_a_simulated_run_has_none(tmp_path, simulated):
    rows = read_steps(R.write_training_run(tmp_path / "train") / "metrics.jsonl")
    assert compiling_steps(rows) == {0}
    assert compiling_steps(read_steps(simulated / "metrics.jsonl")) == set()
    assert json.loads((simulated / "summary.json").read_text())["steps"] == 8
