"""`python -m jaxrl_async.eval [overrides]`: score a model on a task's held-out split.

    python -m jaxrl_async.eval model=smollm2_135m task=gsm8k task.test_path=test.jsonl
    python -m jaxrl_async.eval model.source=RUN_DIR/hf task=copy_string samples=8 output=json

Hydra composes `conf/eval.yaml` (groups: model, task; the top-level keys are `EvalConfig`'s).
`model.source` takes a registered name, a HF directory (a run's `hf/` export) or a .gguf file.
Every prompt of the split (`split=test` by default, `Task.test_examples`) is decoded greedily
once; `samples=k > 1` also draws k samples per prompt at `temperature`. The task's own reward
scores each completion (or its `reward_fn`), and a completion *passes* when its reward is >=
`pass_threshold` (1.0: fully right; dense rewards such as the synthetic tasks' may set less).

Reported (`output=table` prints a table; `output=json` exactly one JSON object on stdout). The
greedy pass and the sampled pass measure different decoders, and the names say which:
  greedy_pass_at_1     greedy completions that pass / prompts              (also as pass_at_1)
  greedy_mean_reward   mean greedy reward                                  (also as mean_reward)
  n                    prompts scored;  reward_errors: rewards that failed (scored 0.0)
  samples > 1, over the k completions per prompt sampled at `temperature`:
  sampled_pass_at_k    prompts with >= 1 passing sample / prompts          (also as pass_at_k)
  sampled_mean_reward  mean sampled reward                                 (also as mean_at_k)
  sampled_pass_at_1    sampled completions that pass / (n·k)
sampled_pass_at_k may be below greedy_pass_at_1: at temperature 1 a small model's samples are
often worse than its argmax. The old keys (docs/design.md §8.7) stay for the scripts that read
them. The decoding, scoring and figures are runtime/evaluation.py's, shared with the evaluation
inside training (`eval.every`, on the training engine).

While it loads the model and compiles, the command says so on stderr (cli/common.py `note`).
Bad input — an unknown model, task or key, a task without a held-out split, a prompt that does
not fit the model's context — is one `error:` line on stderr and exit status 1 (cli/common.py).
"""

from __future__ import annotations

import asyncio
import io
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from jaxrl_async.cli.common import note, run_cached, run_command
from jaxrl_async.models.config import ModelSpec
from planner.configs import build, check

if TYPE_CHECKING:
    from jaxrl_async.runtime.evaluation import EvalResult

# The engine, the model and the tasks import JAX (or seconds of other imports): `evaluate` imports
# them where the work starts, so that `--help` (which reads EvalConfig) stays free of them.

SUMMARY = __doc__.splitlines()[0].split(": ", 1)[1]  # the first line of --help
OUTPUTS = ("table", "json")


@dataclass(frozen=True)
class EvalConfig:
    """`python -m jaxrl_async.eval`'s top-level keys, with their defaults (`--help` lists them).

    Attributes:
      model: the `model=` group: a registered name, a HF directory or a .gguf file
      task: the `task=` group (checked by `build_task`)
      split: test: the held-out prompts | train: the training ones
      samples: k: 1 = greedy only; > 1 also k samples per prompt at `temperature`
      temperature: of the k samples (the greedy pass ignores it)
      top_p: of the k samples
      max_new_tokens: longest completion
      limit: score only the split's first N prompts; null = all
      pass_threshold: a completion passes when its reward is >= this
      seed: sampling seed of the k samples
      num_slots: sequences the engine decodes at once
      output: table | json
    """

    model: ModelSpec
    task: dict
    split: str = "test"
    samples: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 256
    limit: int | None = None
    pass_threshold: float = 1.0
    seed: int = 0
    num_slots: int = 32
    output: str = "table"

    def __post_init__(self) -> None:
        check(self.output in OUTPUTS, "output", self.output, f"must be one of {OUTPUTS}")
        for name in ("samples", "max_new_tokens", "num_slots"):
            value = getattr(self, name)
            check(isinstance(value, int) and value >= 1, name, value, "must be an int >= 1")
        check(self.limit is None or (isinstance(self.limit, int) and self.limit >= 1), "limit", self.limit,
              "must be an int >= 1 or null (all)")
        check(self.temperature > 0, "temperature", self.temperature, "must be > 0 (samples are drawn; greedy is separate)")
        check(0 < self.top_p <= 1, "top_p", self.top_p, "must be in (0, 1]")
        check(self.samples <= self.num_slots, "samples", self.samples,
              f"must be <= num_slots={self.num_slots} (a prompt's samples are decoded together)")


def typed_config(cfg: dict[str, Any]) -> EvalConfig:
    """The composed `conf/eval.yaml` -> `EvalConfig`; every problem is a one-line ValueError."""
    model, task = cfg.get("model"), cfg.get("task")
    check(isinstance(model, dict) and "source" in model, "model", model, "choose one with model=NAME (conf/model/*.yaml)")
    check(isinstance(task, dict) and "name" in task, "task", task, "choose one with task=NAME (conf/task/*.yaml)")
    return build(EvalConfig, {**cfg, "model": {**model, "source": str(model["source"])}}, "")


def evaluate(config: EvalConfig, *, say: Callable[[str], None] = lambda _: None) -> tuple[EvalResult, dict[str, Any]]:
    """Load the model and the task, decode the split, score it. Returns (result, run facts);
    `say` gets a status line before each slow phase (the command line prints them on stderr)."""
    from jaxrl_async.engines.base import SamplingParams
    from jaxrl_async.engines.jax.config import EngineConfig
    from jaxrl_async.engines.jax.core import EngineCore
    from jaxrl_async.models.loading import load_model
    from jaxrl_async.runtime.evaluation import decode_all, score_all, summarize
    from jaxrl_async.tasks import build_task

    task = build_task(config.task)  # data first: a missing split fails before the model loads
    examples = task.split_examples(config.split)[: config.limit]
    say(f"loading model {config.model.source} ...")
    loaded = load_model(config.model.source, dtype=config.model.dtype, adapter=config.model.adapter)
    tok = loaded.tokenizer
    if tok is None:
        raise ValueError(f"model.source={config.model.source!r}: has no tokenizer.json; cannot encode prompts")
    encode = task.encoder(tok, loaded.chat_template)
    prompts = [encode(e) for e in examples]
    need = max(len(p.prompt_ids) for p in prompts) + config.max_new_tokens
    context = loaded.cfg.max_position_embeddings
    if need > context:
        raise ValueError(f"the longest prompt + max_new_tokens={config.max_new_tokens} = {need} tokens exceeds the "
                         f"model's context max_position_embeddings={context}")
    stop = loaded.stop_token_ids
    core = EngineCore(loaded.model, loaded.cfg, EngineConfig(num_slots=config.num_slots, max_len=need,
                                                             min_bucket=min(16, need), seed=config.seed))
    t0 = time.monotonic()
    greedy_params = SamplingParams(max_new_tokens=config.max_new_tokens, temperature=0.0, stop_token_ids=stop)
    say(f"compiling and decoding {len(prompts)} prompts greedily ...")
    greedy = asyncio.run(score_all(task, tok, prompts, decode_all(core, prompts, greedy_params)))
    sampled = None
    if config.samples > 1:
        params = SamplingParams(max_new_tokens=config.max_new_tokens, temperature=config.temperature,
                                top_p=config.top_p, stop_token_ids=stop, n=config.samples, seed=config.seed)
        say(f"sampling {config.samples} completions per prompt at temperature={config.temperature} ...")
        sampled = asyncio.run(score_all(task, tok, prompts, decode_all(core, prompts, params)))
    result = summarize(greedy, sampled, config.pass_threshold)
    facts = {"model": config.model.source, "task": config.task["name"], "split": config.split,
             "elapsed_s": round(time.monotonic() - t0, 3)}
    return result, facts


def table(result: EvalResult, facts: dict[str, Any]) -> str:
    """The `output=table` rendering (rich, no colours: it goes to logs as often as to a terminal)."""
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"{facts['model']} on {facts['task']} ({facts['split']}, {result.n} prompts, "
                    f"{facts['elapsed_s']:.0f} s)")
    t.add_column("metric")
    t.add_column("value", justify="right")
    t.add_column("what")
    figures = result.to_json()
    for key, what in TABLE_ROWS:
        if key in figures:
            value = figures[key]
            t.add_row(key, f"{value:.4f}" if isinstance(value, float) else str(value), what)
    console = Console(color_system=None, width=100, file=io.StringIO())
    console.print(t)
    return console.file.getvalue()


# The table's rows: the names that say what they measure (output=json also keeps the old keys).
TABLE_ROWS = (
    ("greedy_pass_at_1", "greedy completions that pass / prompts"),
    ("greedy_mean_reward", "mean reward of the greedy completions"),
    ("sampled_pass_at_k", "prompts with >= 1 passing sample of k"),
    ("sampled_pass_at_1", "sampled completions that pass"),
    ("sampled_mean_reward", "mean reward of the sampled completions"),
    ("n", "prompts scored"),
    ("samples", "k: completions sampled per prompt"),
    ("reward_errors", "rewards that failed (scored 0.0)"),
)


def main(argv: list[str] | None = None) -> int:
    def show(config: EvalConfig, measured: tuple[EvalResult, dict[str, Any]]) -> str:
        result, facts = measured
        return json.dumps({**result.to_json(), **facts}) + "\n" if config.output == "json" else table(result, facts)

    return run_command("eval", SUMMARY, EvalConfig, argv, typed_config, lambda config: evaluate(config, say=note), show)


def run() -> None:
    """`python -m` entry (this module's and the jaxrl_async/eval.py shim's)."""
    run_cached(main)


if __name__ == "__main__":
    run()
