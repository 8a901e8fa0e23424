"""`python -m planner.simulate` and `python -m planner.compare` end to end (subprocesses: real Hydra)."""

import json
import subprocess
import sys

import pytest

from planner.run_files import SUMMARY_KEYS
from planner.ledger_audit import audit
from planner.tools.simulate import SimulateConfig, SimulateKeys, calibration_mismatch
from tests.helpers import REPO
from tests.helpers.docstrings import undocumented_fields


@pytest.fixture
def conf(tmp_path):
    """A policy config dir, so the tests do not depend on which conf/policy files exist yet."""
    (tmp_path / "conf" / "policy").mkdir(parents=True)
    (tmp_path / "conf" / "policy" / "nemo_in_order.yaml").write_text("name: nemo_in_order\n")
    return tmp_path / "conf"


def cli(module, *args, conf=None):
    extra = ["--config-dir", str(conf)] if conf and module in ("planner.simulate", "planner.tools.simulate") else []
    return subprocess.run([sys.executable, "-m", module, *extra, *args], cwd=REPO, capture_output=True, text=True,
                          timeout=120)


@pytest.mark.slow
def test_simulate_writes_the_contract_files_into_the_run_dir(tmp_path, conf):
    run = tmp_path / "run"
    p = cli("planner.simulate", "policy=nemo_in_order", "max_staleness=1", "batch_groups=4", "group_size=4",
            "steps=10", "seed=3", "sim=uneven", f"hydra.run.dir={run}", conf=conf)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip().splitlines()[-1] == f"wrote {run}"  # where it wrote, last
    summary = json.loads((run / "summary.json").read_text())
    assert list(summary)[: len(SUMMARY_KEYS)] == list(SUMMARY_KEYS)
    assert 0 < summary["steps_per_hour_steady"] and "in the steady state" in p.stdout
    assert summary["policy"] == "nemo_in_order" and summary["steps"] == 10 and summary["max_staleness"] == 1
    assert audit(run).ok
    for name in ("ledger.jsonl", "metrics.jsonl", "staleness_hist.png", "utilisation.png"):
        assert (run / name).stat().st_size > 0


@pytest.mark.slow
def test_the_stable_command_name_and_the_tools_module_run_the_same_simulation(tmp_path, conf):
    """`python -m planner.simulate` is a shim over `planner.tools.simulate`: same config, same ledger."""
    args = ("policy=nemo_in_order", "max_staleness=1", "batch_groups=4", "group_size=4", "steps=6", "sim=uneven")
    ledgers = []
    for module in ("planner.simulate", "planner.tools.simulate"):
        p = cli(module, *args, f"hydra.run.dir={tmp_path / module}", conf=conf)
        assert p.returncode == 0, p.stderr
        ledgers.append((tmp_path / module / "ledger.jsonl").read_bytes())
    assert ledgers[0] == ledgers[1] and ledgers[0].count(b'"event":"train"') == 6


@pytest.mark.slow
def test_simulate_multirun_sweeps_staleness(tmp_path, conf):
    p = cli("planner.simulate", "-m", "policy=nemo_in_order", "max_staleness=1,2", "steps=5", "batch_groups=4",
            f"hydra.sweep.dir={tmp_path / 'sweep'}", conf=conf)
    assert p.returncode == 0, p.stderr
    etas = sorted(json.loads(f.read_text())["max_staleness"] for f in (tmp_path / "sweep").glob("*/summary.json"))
    assert etas == [1, 2]


@pytest.mark.parametrize(
    ("arg", "message"),
    [
        ("max_staleness=-1", "error: max_staleness=-1: must be >= 0"),
        ("batch_groups=0", "error: batch_groups=0: must be a positive integer"),
        ("policy=no_such_policy", "error: policy=no_such_policy: unknown option (options: areal,"),
    ],
)
def test_simulate_rejects_bad_input_with_one_line_and_exit_1(tmp_path, conf, arg, message):
    p = cli("planner.simulate", "policy=nemo_in_order", arg, f"hydra.run.dir={tmp_path}", conf=conf)
    assert p.returncode == 1
    assert p.stderr.strip().splitlines() == [p.stderr.strip()] and p.stderr.startswith(message), p.stderr


def test_simulate_names_file_line_and_field_of_a_trace_length_too_large(tmp_path, conf):
    trace = tmp_path / "trace.jsonl"
    trace.write_text('{"prompt_id": 0, "lengths": [3, 4]}\n{"prompt_id": 1, "lengths": [5, 100000000000000000000]}\n')
    p = cli("planner.simulate", "policy=nemo_in_order", "group_size=2", "workload=trace", f"workload.path={trace}",
            f"hydra.run.dir={tmp_path / 'run'}", conf=conf)
    assert p.returncode == 1 and "Traceback" not in p.stderr
    assert p.stderr.strip() == f"error: {trace}:2: 'lengths' holds 100000000000000000000: lengths must be <= 2147483647"
    assert not (tmp_path / "run" / "ledger.jsonl").exists()  # refused before the run starts


def base_config(**over):
    cfg = {"policy": {"name": "nemo_in_order"}, "max_staleness": 2, "batch_groups": 4, "group_size": 2, "steps": 3,
           "seed": 0, "workload": {"name": "lognormal"}, "sim": {}}
    cfg.update(over)
    return cfg


@pytest.mark.parametrize(
    ("over", "message"),
    [
        ({"stepz": 3}, "stepz: unknown key"),
        ({"group_size": 1.5}, "group_size=1.5: must be an integer"),
        ({"seed": "0"}, "seed='0': must be an integer"),
        ({"max_staleness": True}, "max_staleness=True: must be an integer, or null"),
        ({"steps": None}, "steps=null: must be an integer"),
        ({"workload": "lognormal"}, "workload='lognormal': must be a mapping"),
        ({"policy": {"name": "lookahead", "migrate": "no"}}, "policy.migrate='no': must be true or false"),
        ({"policy": {"name": "nemo_in_order", "nope": 1}}, "policy.nope: unknown parameter"),
        ({"sim": {"workers": {"sync_mode": "later"}}}, "sim.workers.sync_mode='later'"),
        ({"sim": {"workers": {"sync_mode": "pinned", "resident_versions": 0}}},
         "sim.workers.resident_versions=0: must be an int >= 1"),
        ({"sim": {"admission_window": 0}}, "sim.admission_window=0: must be an int >= 1, or null for the default"),
        ({"workload": {"name": "lognormal", "mu": 6, "extra": 1}}, "workload.extra: unknown key"),
    ],
)
def test_the_typed_config_rejects_unknown_keys_and_bad_values(over, message):
    with pytest.raises(ValueError, match=message.replace(".", r"\.")):
        SimulateConfig.from_mapping(base_config(**over))


def test_a_missing_top_level_key_is_one_line_naming_it():
    cfg = base_config()
    del cfg["steps"]
    with pytest.raises(ValueError, match=r"^steps: required key missing \(set steps=\.\.\.\)$"):
        SimulateConfig.from_mapping(cfg)


def test_the_top_level_keys_are_documented_in_their_dataclass():
    assert undocumented_fields(SimulateKeys) == []


@pytest.mark.parametrize(("arg", "message"), [
    ("policy.migrate=no", "error: policy.migrate='no': must be true or false"),
    ("policy.tail_fraction=yes", "error: policy.tail_fraction='yes': must be a number"),
    ("seed=1.5", "error: seed=1.5: must be an integer"),
])
def test_simulate_refuses_a_mistyped_key_in_one_line_and_leaves_nothing_behind(tmp_path, arg, message):
    p = cli("planner.simulate", "policy=lookahead", arg, f"hydra.run.dir={tmp_path / 'run'}")
    assert p.returncode == 1 and p.stderr.strip() == message, p.stderr
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_compare_writes_table_csv_and_plots_in_one_command(tmp_path, conf):
    out = tmp_path / "cmp"
    p = cli("planner.compare", "policies=[nemo_in_order]", "etas=[1,2]", "workloads=[lognormal,bimodal]",
            "reference_policy=nemo_in_order", "gantt_policy=nemo_in_order", f"out={out}", "steps=6", "batch_groups=4",
            f"hydra.searchpath=[file://{conf}]")
    assert p.returncode == 0, p.stderr
    assert (out / "results.md").read_text().count("| nemo_in_order |") == 4
    lines = (out / "results.csv").read_text().splitlines()
    assert lines[0].startswith("workload,policy,eta,steps_per_hour,unbounded_ceiling,no_drop_bound") and len(lines) == 5
    for wl in ("lognormal", "bimodal"):
        for f in ("throughput_vs_eta", "staleness_eta1", "nemo_in_order_utilisation_eta1", "nemo_in_order_gantt_eta1"):
            assert (out / f"{wl}_{f}.png").stat().st_size > 0


def composed_simulate(*overrides):
    """`conf/simulate.yaml` as `python -m planner.simulate` composes it, typed."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from planner.tools.simulate import CONF_DIR, register_config_nodes

    register_config_nodes()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("simulate", overrides=list(overrides))
    return SimulateConfig.from_mapping(OmegaConf.to_container(cfg, resolve=True))


def test_an_explicit_null_policy_parameter_survives_the_config_and_a_parameter_not_given_is_the_default():
    """`policy.window_fraction=null` is torchtitan's strict FIFO, not its default 0.3."""
    base = ("policy=torchtitan_windowed_fifo", "max_staleness=2", "batch_groups=4")
    default, strict = composed_simulate(*base), composed_simulate(*base, "policy.window_fraction=null")
    assert default.policy_params == {} and default.build_policy().window_size == 3
    assert strict.policy_params == {"window_fraction": None} and strict.build_policy().window_size == 1


def test_a_calibration_fitted_to_another_run_says_which_keys_differ_and_how_to_replay(tmp_path):
    path = tmp_path / "calibration.yaml"
    path.write_text("sim: {}\nrun: {policy: nemo_in_order, max_staleness: 1, batch_groups: 4, group_size: 2, "
                    "steps: 3, replay: python -m planner.simulate X}\n")
    same = SimulateConfig.from_mapping(base_config(max_staleness=1))
    assert calibration_mismatch(str(path), same) is None
    other = SimulateConfig.from_mapping(base_config(max_staleness=2, steps=7))
    warning = calibration_mismatch(str(path), other)
    assert "max_staleness=2 (the run's 1), steps=7 (the run's 3)" in warning and "batch_groups" not in warning
    assert warning.endswith("to replay the run: python -m planner.simulate X") and "\n" not in warning


def test_simulate_runs_multi_turn_episodes_and_warns_of_a_stall_key_that_cannot_act(tmp_path):
    run = tmp_path / "run"
    p = cli("planner.simulate", "workload=multi_turn", "batch_groups=4", "group_size=4", "steps=6",
            "sim.faults.stall_prob=0.1", f"hydra.run.dir={run}")
    assert p.returncode == 0, p.stderr
    assert p.stderr.count("warning: ") == 1 and "sim.faults.stall_prob=0.1: has no effect with workload=multi_turn" \
        in p.stderr
    summary = json.loads((run / "summary.json").read_text())
    assert summary["episodes"]["episodes"] == 4 * 4 * 6 and summary["groups_stalled"] == 0
    report = audit(run)
    assert report.ok and report.episodes == 4 * 4 * 6
    quiet = cli("planner.simulate", "workload=multi_turn", "batch_groups=4", "group_size=4", "steps=2",
                f"hydra.run.dir={tmp_path / 'quiet'}")
    assert quiet.returncode == 0 and "warning" not in quiet.stderr


def test_simulate_warns_of_resident_versions_without_pinned_and_runs_pinned_quietly(tmp_path):
    loud = cli("planner.simulate", "steps=3", "sim.workers.resident_versions=2", f"hydra.run.dir={tmp_path / 'loud'}")
    assert loud.returncode == 0, loud.stderr
    assert loud.stderr.count("warning: ") == 1 and "sim.workers.resident_versions=2: has no effect with " \
        "sim.workers.sync_mode=partial" in loud.stderr
    quiet = cli("planner.simulate", "steps=3", "sim.workers.sync_mode=pinned", "sim.workers.resident_versions=2",
                f"hydra.run.dir={tmp_path / 'quiet'}")
    assert quiet.returncode == 0 and "warning" not in quiet.stderr, quiet.stderr
    updates = json.loads((tmp_path / "quiet" / "summary.json").read_text())["weight_updates"]
    assert updates["sync_mode"] == "pinned" and updates["resident_versions"] == 2 and updates["loads"] > 0
