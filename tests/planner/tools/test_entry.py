"""planner/tools/entry.py: one line naming what the user typed, the nearest valid names, no leftover run dir."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from planner.tools.simulate import CONF_DIR, register_config_nodes
from planner.tools import entry
from planner.tools.help import HelpSpec
from tests.helpers import REPO


def simulate(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "planner.simulate", "steps=3", "batch_groups=2", *args], cwd=cwd,
                          env=env, capture_output=True, text=True, timeout=120)


def one_line(p: subprocess.CompletedProcess) -> str:
    assert p.returncode == 1, (p.stdout, p.stderr)
    assert p.stderr.count("\n") == 1 and p.stderr.startswith("error: "), p.stderr
    return p.stderr.strip()


@pytest.mark.parametrize(("arg", "line"), [
    ("max_stalenes=2", "error: max_stalenes: unknown key (did you mean max_staleness?)"),
    ("sim.workrs.t_sync=1", "error: sim.workrs.t_sync: unknown key (did you mean sim.workers.t_sync?)"),
    ("sim.trainer.c0=abc", "error: sim.trainer.c0='abc': must be a number"),
    ("workload.mu=abc", "error: workload.mu='abc': must be a number"),
])
def test_a_misspelt_key_or_a_bad_value_is_one_line_and_leaves_no_run_dir(tmp_path, arg, line):
    p = simulate(arg, f"hydra.run.dir={tmp_path / 'run'}")
    assert one_line(p) == line
    assert "+max_stalenes" not in p.stderr and not (tmp_path / "run").exists()


def test_a_misspelt_group_option_names_the_nearest_and_every_option(tmp_path):
    line = one_line(simulate("policy=lookahed", cwd=tmp_path))
    assert line.startswith("error: policy=lookahed: unknown option (did you mean lookahead? options: areal, ")
    assert "verl_wait)" in line and list(tmp_path.iterdir()) == []  # no outputs/ folder


def test_every_job_of_a_multirun_is_checked_before_the_first_runs(tmp_path):
    p = simulate("-m", "max_staleness=1,x", f"hydra.sweep.dir={tmp_path / 'sweep'}")
    assert one_line(p) == "error: max_staleness='x': must be an integer, or null"
    assert not (tmp_path / "sweep").exists()


@pytest.fixture
def simulate_conf():
    register_config_nodes()
    return CONF_DIR


@pytest.mark.parametrize(("override", "message"), [
    ("workers.t_sync=1", "workers.t_sync: unknown key (did you mean sim.workers.t_sync?)"),
    ("sim.trainer.c00=1", "sim.trainer.c00: unknown key (did you mean sim.trainer.c0?)"),
    ("sim.trainer.q=1", "sim.trainer.q: unknown key (known in sim.trainer: c0, c1, compile_s, wait_sync)"),
    ("steps.x=1", "steps.x: unknown key (steps is a value, not a section)"),
    ("polcy=areal", "polcy: unknown key (did you mean policy?)"),
    ("sim=unven", "sim=unven: unknown option (did you mean uneven? options: default, fault, slot_limited, uneven)"),
])
def test_the_nearest_names_come_from_the_section_the_key_is_in(simulate_conf, override, message):
    with pytest.raises(ValueError) as info:
        entry.check_overrides(simulate_conf, "simulate", [override])
    assert str(info.value) == message


def test_valid_keys_options_additions_and_hydra_keys_pass(simulate_conf):
    entry.check_overrides(simulate_conf, "simulate", [
        "policy=areal", "policy.max_head_offpolicyness=2", "workload=trace", "workload.path=t.jsonl",
        "sim=uneven", "sim.workers.speeds=[1,2,1,1]", "+extra=1", "hydra.run.dir=x", "max_staleness=1,2"])


# A command on a conf dir of its own, whose task rejects its input after Hydra made the run dir.
def command(conf: Path) -> entry.Command:
    (conf / "app.yaml").write_text("steps: 1\nhydra:\n  run:\n    dir: ${out}\nout: unset\n")
    return entry.Command(conf, "app", HelpSpec("app", "a test command", {}))


def run_app(monkeypatch, conf: Path, run_dir: Path, status: int) -> int:
    def task(cfg):
        if status:
            print("error: rejected", file=sys.stderr)
            sys.exit(status)

    monkeypatch.setattr(sys, "argv", ["app", f"out={run_dir}"])
    with pytest.raises(SystemExit) as info:
        entry.hydra_main(command(conf), task)
        raise SystemExit(0)
    return info.value.code


def test_a_task_that_rejects_its_input_leaves_no_new_run_dir_but_keeps_one_that_held_files(tmp_path, monkeypatch):
    conf = tmp_path / "conf"
    conf.mkdir()
    fresh = tmp_path / "fresh"
    assert run_app(monkeypatch, conf, fresh, 1) == 1 and not fresh.exists()
    resumed = tmp_path / "resumed"
    resumed.mkdir()
    (resumed / "ledger.jsonl").write_text('{"event": "admit"}\n')
    assert run_app(monkeypatch, conf, resumed, 1) == 1
    assert (resumed / "ledger.jsonl").read_text() == '{"event": "admit"}\n'
    earlier = tmp_path / "earlier"  # held only an earlier command's Hydra files: still not this command's
    (earlier / ".hydra").mkdir(parents=True)
    (earlier / ".hydra" / "config.yaml").write_text("steps: 1\n")
    assert run_app(monkeypatch, conf, earlier, 1) == 1 and (earlier / ".hydra").is_dir()
    done = tmp_path / "done"
    assert run_app(monkeypatch, conf, done, 0) == 0 and (done / ".hydra" / "config.yaml").exists()
    assert (done / "test_entry.log").exists()  # the job keeps the name of the task, not of the wrapper


def test_the_option_parser_says_one_line_with_the_nearest_option(capsys):
    parser = entry.ArgumentParser(prog="prog")
    parser.add_argument("--max-staleness", type=int)
    with pytest.raises(SystemExit) as info:
        parser.parse_args(["--max-stalness", "1"])
    err = capsys.readouterr().err
    assert info.value.code == 2 and err.count("\n") == 1
    assert err.startswith("error: unrecognized arguments: --max-stalness 1 (did you mean --max-staleness?)")
