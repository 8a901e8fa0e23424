"""`python -m jaxrl_async.eval [overrides]`: score a model on a task's held-out split.

    python -m jaxrl_async.eval model=smollm2_135m task=gsm8k task.test_path=test.jsonl
    python -m jaxrl_async.eval model.source=RUN_DIR/hf task=copy_string samples=8 output=json

Hydra composes `conf/eval.yaml` (groups: model, task; the top-level keys are `EvalConfig`'s).
`model.source` takes a registered name, a HF directory (a run's `hf/` export) or a .gguf file.
Every prompt of the split (`split=test` by default, `Task.test_examples`) is decoded greedily
once; `samples=k > 1` also draws k samples per prompt at `temperature`. The task's own reward
scores each completion (or its `reward_fn`), and a completion *passes* when its reward is >=
`pass_threshold` (1.0: fully right; dense rewards such as the synthetic tasks' may set less).
A multi-turn task (`task.multi_turn`: calculator, guess_number, verifiers) plays each prompt as an
episode instead (a greedy one; k sampled ones), every turn at most `max_new_tokens` and the whole
conversation within `max_len`, over the same episode engine as training (envs/engine.py); the
episode's result is its reward, and an episode that faults (`too_long`, `env_timeout`, ...) is
counted in `reward_errors` and scores 0.0.

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
    from jaxrl_async.engines.base import SamplingParams
    from jaxrl_async.engines.jax.config import EngineConfig
    from jaxrl_async.envs.task import EpisodeTask
    from jaxrl_async.models.loading import LoadedModel
    from jaxrl_async.runtime.evaluation import EvalResult
    from jaxrl_async.tasks.base import Prompt
    from jaxrl_async.tasks.rewards import RewardResult

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
      max_len: the engine's context in tokens; a multi-turn episode's whole conversation must fit
        in it (a turn with no room left ends the episode as a `too_long` fault, counted in
        reward_errors); null = the model's context (single-turn: the longest prompt + max_new_tokens)
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
    max_len: int | None = None
    output: str = "table"

    def __post_init__(self) -> None:
        check(self.output in OUTPUTS, "output", self.output, f"must be one of {OUTPUTS}")
        for name in ("samples", "max_new_tokens", "num_slots"):
            value = getattr(self, name)
            check(isinstance(value, int) and value >= 1, name, value, "must be an int >= 1")
        check(self.limit is None or (isinstance(self.limit, int) and self.limit >= 1), "limit", self.limit,
              "must be an int >= 1 or null (all)")
        check(self.max_len is None or (isinstance(self.max_len, int) and self.max_len >= 2), "max_len", self.max_len,
              "must be an int >= 2 or null (the model's context)")
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
    from jaxrl_async.runtime.evaluation import decode_all, greedy_sampling, score_all, summarize
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
    stop = loaded.stop_token_ids
    greedy_params = greedy_sampling(config.max_new_tokens, stop)
    params = SamplingParams(max_new_tokens=config.max_new_tokens, temperature=config.temperature,
                            top_p=config.top_p, stop_token_ids=stop, n=config.samples, seed=config.seed)
    max_len = engine_context(config, task.multi_turn, max(len(p.prompt_ids) for p in prompts),
                             loaded.cfg.max_position_embeddings)
    engine_cfg = EngineConfig(num_slots=config.num_slots, max_len=max_len, min_bucket=min(16, max_len), seed=config.seed)
    t0 = time.monotonic()
    say(f"compiling and {'playing' if task.multi_turn else 'decoding'} {len(prompts)} prompts greedily ...")
    if task.multi_turn:
        greedy, sampled = asyncio.run(play_all(config, loaded, task, prompts, engine_cfg, greedy_params, params, say))
    else:
        core = EngineCore(loaded.model, loaded.cfg, engine_cfg)
        greedy = asyncio.run(score_all(task, tok, prompts, decode_all(core, prompts, greedy_params)))
        sampled = None
        if config.samples > 1:
            say(sampling_note(config))
            sampled = asyncio.run(score_all(task, tok, prompts, decode_all(core, prompts, params)))
    result = summarize(greedy, sampled, config.pass_threshold)
    facts = {"model": config.model.source, "task": config.task["name"], "split": config.split,
             "elapsed_s": round(time.monotonic() - t0, 3)}
    return result, facts


def engine_context(config: EvalConfig, multi_turn: bool, longest_prompt: int, model_context: int) -> int:
    """The engine's `max_len`. Single-turn: the longest prompt + max_new_tokens (or `config.max_len`,
    which must hold it). Multi-turn: `config.max_len` (null: the model's context), which must leave
    the longest prompt room for a token; the episodes' later turns get what is left of it."""
    need = longest_prompt + (1 if multi_turn else config.max_new_tokens)
    what = "the longest prompt + 1" if multi_turn else f"the longest prompt + max_new_tokens={config.max_new_tokens}"
    if need > model_context:
        raise ValueError(f"{what} = {need} tokens exceeds the model's context max_position_embeddings={model_context}")
    if config.max_len is not None and not need <= config.max_len <= model_context:
        raise ValueError(f"max_len={config.max_len}: must hold {what} = {need} tokens and be <= the model's "
                         f"context max_position_embeddings={model_context}")
    if config.max_len is not None:
        return config.max_len
    return model_context if multi_turn else need


def sampling_note(config: EvalConfig) -> str:
    return f"sampling {config.samples} completions per prompt at temperature={config.temperature} ..."


async def play_all(config: EvalConfig, loaded: LoadedModel, task: EpisodeTask, prompts: list[Prompt],
                   engine_cfg: EngineConfig, greedy_params: SamplingParams, params: SamplingParams,
                   say: Callable[[str], None]) -> tuple[list[list[RewardResult]], list[list[RewardResult]] | None]:
    """A multi-turn task's passes: every prompt played as an episode (the greedy one, then k sampled
    ones when samples > 1) on a JaxEngine behind an EpisodeEngine (envs/engine.py), as the
    evaluation inside training plays them (runtime/evaluation.py `EngineEval`). Per prompt, each
    episode's reward (`episode_reward`: a faulted episode is a reward error)."""
    from jaxrl_async.engines.jax.engine import JaxEngine
    from jaxrl_async.envs.engine import play_episodes
    from jaxrl_async.envs.task import EpisodeContext
    from jaxrl_async.runtime.evaluation import EngineEval, run_on_engine

    inner = JaxEngine(loaded.model, loaded.cfg, engine_cfg)
    engine = play_episodes(inner, task, EpisodeContext(loaded.tokenizer, tuple(loaded.stop_token_ids)), engine_cfg)
    await engine.start()
    try:
        greedy = await (await run_on_engine(engine, EngineEval(prompts, 0, greedy_params, episodes=True))).rewards(
            task, loaded.tokenizer)
        sampled = None
        if config.samples > 1:
            say(sampling_note(config))
            sampled = await (await run_on_engine(engine, EngineEval(prompts, 0, params, episodes=True))).rewards(
                task, loaded.tokenizer)
    finally:
        await engine.stop()
    return greedy, sampled


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
