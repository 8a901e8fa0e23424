"""`python -m planner.plots RUN_DIR`: a simulated run and a training run drawn by the same code;
a training run's active sequences come from its trace and its compile is drawn apart, and a
training run also gets its curves: reward, loss, held-out pass@1 and staleness per step."""

import json
import math
import shutil

import pytest

import planner.policies.lookahead  # noqa: F401  (registers lookahead)
from planner.sim.metrics import read_steps
from planner.tools.plots import (compiling_steps, is_training_run, main, run_plots, trace_active, training_figure,
                                 training_series)
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
                                                    for n in ("staleness_hist.png", "utilisation.png",
                                                              "training_curves.png")]
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


# ---------------------------------------------------------------- a training run's curves
EVAL_RUN = ["steps=6", "batch_groups=2", "group_size=4", "max_new_tokens=6", "eval.every=2", "eval.prompts=3"]


def _panels(fig):
    """A figure's axes by their y label, each as {line label: (xs, ys)}; closes the figure."""
    import matplotlib.pyplot as plt

    panels = {ax.get_ylabel(): {line.get_label(): (list(line.get_xdata()), list(line.get_ydata()))
                                for line in ax.get_lines()} for ax in fig.axes}
    plt.close(fig)
    return panels


@pytest.mark.slow
def test_a_real_training_run_draws_reward_loss_held_out_pass_at_1_and_staleness_per_step(tmp_path):
    from tests.helpers.train_runs import make_job

    run_dir = tmp_path / "train"
    summary = make_job(run_dir, EVAL_RUN).run()
    paths = run_plots(run_dir, tmp_path / "plots")
    assert [p.name for p in paths] == ["staleness_hist.png", "utilisation.png", "training_curves.png"]
    assert paths[2].stat().st_size > 0
    rows = read_steps(run_dir / "metrics.jsonl")
    panels = _panels(training_figure(training_series(rows, summary)))
    assert set(panels) == {"reward", "loss", "held-out score", "staleness (steps)"}
    steps = [r["step"] for r in rows]
    assert panels["reward"]["batch mean reward"] == (steps, [r["reward_mean"] for r in rows])
    assert panels["loss"]["loss"] == (steps, [r["loss"] for r in rows])
    # The base model (0) and the weights after steps 2 and 4, at those x (the run's own evaluations).
    evals = [r for r in rows if "eval/pass_at_1" in r]
    assert panels["held-out score"]["pass@1 (greedy)"] == ([0, 2, 4], [r["eval/pass_at_1"] for r in evals])
    assert panels["held-out score"]["mean reward"][0] == [0, 2, 4]
    staleness = panels["staleness (steps)"]
    assert staleness["max"] == (steps, [r["max_staleness_in_batch"] for r in rows])
    assert staleness["mean over tokens"] == (steps, [r["mean_staleness_in_batch"] for r in rows])
    assert staleness["η = 1 (bound)"][1] == [1, 1]


def test_a_simulated_run_keeps_its_two_plots_and_draws_no_training_curves(simulated, tmp_path):
    rows = read_steps(simulated / "metrics.jsonl")
    assert not is_training_run(rows)  # no model: reward and loss are null
    assert [p.name for p in run_plots(simulated, tmp_path / "out")] == ["staleness_hist.png", "utilisation.png"]
    assert not (tmp_path / "out" / "training_curves.png").exists()


def record(step, loss=0.5, **extra):
    return {"step": step, "reward_mean": 0.25 * step, "loss": loss, "max_staleness_in_batch": 1,
            "mean_staleness_in_batch": 0.5} | extra


def test_an_evaluation_is_drawn_at_its_weights_steps_a_null_loss_as_a_gap_and_the_last_one_from_the_summary():
    # The base model's evaluation finished during step 1: it is drawn at x = 0, its weights' steps.
    rows = [record(0), record(1, loss=None, **{"eval/pass_at_1": 0.0, "eval/mean_reward": 0.1, "eval/version": 0,
                                               "eval/n": 4}), record(2)]
    summary = {"max_staleness": 2, "eval": {"eval/pass_at_1": 0.5, "eval/mean_reward": 0.6, "eval/version": 3,
                                            "eval/n": 4}}
    series = training_series(rows, summary)
    assert [x for x, _ in series["loss"]] == [0, 1, 2] and math.isnan(series["loss"][1][1])
    assert series["eval_pass_at_1"] == [(0, 0.0), (3, 0.5)]  # the last one finished after the last record
    assert series["eval_mean_reward"] == [(0, 0.1), (3, 0.6)] and series["eval_prompts"] == 4
    assert series["max_staleness"] == [(0, 1.0), (1, 1.0), (2, 1.0)] and series["eta"] == 2
    assert series["mean_staleness"] == [(0, 0.5), (1, 0.5), (2, 0.5)]
    panels = _panels(training_figure(training_series([rows[0], rows[2]], {"max_staleness": None})))
    assert panels["held-out score"] == {}  # no evaluation: the panel says so in words, no empty line
    assert not any(label.startswith("η") for label in panels["staleness (steps)"])  # unbounded: no bound line
