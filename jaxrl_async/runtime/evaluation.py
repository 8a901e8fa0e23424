"""Held-out evaluation during training, on the run's own engine (`eval.every`, runtime/config.py).

When (`EvalScheduler`): before the first step of a fresh run, on the base model (as verl's
`val_before_train`, so that every curve starts from the base model), and after every `every`-th
step, once the engine holds that step's weights; one at a time, a due one while another runs is
skipped with a warning. The figures go into the next step's metrics record (`eval/version` says
which weights they are of; 0 is the base model), the last ones into summary.json.

How it shares the engine without touching the planner's guarantee: its requests (ids
`eval.<version>.<i>`, greedy, one sample each) go to the same engine at `EVAL_PRIORITY`, below
every rollout, so they only take slots that no admitted group is waiting for; the controller routes
their pieces here before the rollout collector sees them, so no policy event, ledger line or stall
check is made for them. What they cost is engine time, visible as generator busy time and in
the step times around them. Weights: they start once the engine holds `version`; under
`sync_mode=partial` a later push may reach a long evaluation mid-way, so `version` is the
weights it started on (the lowest version of any of its tokens is reported too); with pinned
adapter versions (`engine.adapter_versions` > 1) each evaluation request runs wholly on the
version it was admitted on.

Scoring and the figures (`decode_all`, `score_all`, `summarize`, `EvalResult`, the block at the
end of this file) are shared with `python -m jaxrl_async.eval` (jaxrl_async/cli/eval.py), so a
figure in metrics.jsonl means what the command line prints for the same model and prompts; so is
`EngineEval`, which plays a multi-turn task's prompts as episodes both here and there
(`run_on_engine`: the command line's greedy and sampled passes on an EpisodeEngine of its own).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any

from jaxrl_async.engines.base import GenerationEngine, GenerationRequest, SampleOutput, SamplingParams
from jaxrl_async.tasks.base import Prompt, Task
from jaxrl_async.runtime.scoring import episode_reward
from jaxrl_async.tasks.rewards import RewardResult
from jaxrl_async.tokenizer import Tokenizer

EVAL_PREFIX = "eval."
EVAL_PRIORITY = 1e30  # after every rollout: lower priorities are admitted first


def is_eval_request(request_id: str) -> bool:
    return request_id.startswith(EVAL_PREFIX)


log = logging.getLogger(__name__)


class EvalScheduler:
    """When the run evaluates, the evaluation running on the engine, and its figures.

    `every`: `eval.every` (0: never). The controller asks `due(steps_done)` once the engine holds
    the weights of that many steps, sends `start(version)`'s requests, routes eval pieces to
    `add` and, once it returns the finished evaluation, scores it and hands the figures to
    `finished`. `take_pending` gives them to the next step record once; `last` keeps them.
    """

    def __init__(self, prompts: list[Prompt], every: int, *, max_new_tokens: int,
                 stop_token_ids: tuple[int, ...], episodes: bool = False) -> None:
        self.prompts, self.every = list(prompts), every
        self.max_new_tokens, self.stop_token_ids = max_new_tokens, stop_token_ids
        self.episodes = episodes  # a multi-turn task: each prompt is played as a (greedy) episode
        self.running: EngineEval | None = None
        self.last: dict[str, Any] | None = None
        self._pending: dict[str, Any] = {}

    def due(self, steps_done: int) -> bool:
        """Whether the weights after `steps_done` steps are evaluated (0: the base model, before training)."""
        return bool(self.every) and steps_done % self.every == 0

    def start(self, version: int) -> list[GenerationRequest]:
        """The requests of an evaluation of `version`; none while another one runs (it is skipped)."""
        if self.running is not None:
            log.warning("evaluation of version %d skipped: the one of version %d is still running",
                        version, self.running.version)
            return []
        self.running = EngineEval(self.prompts, version, greedy_sampling(self.max_new_tokens, self.stop_token_ids),
                                  episodes=self.episodes)
        return self.running.requests()

    async def submit(self, engine: GenerationEngine, version: int) -> None:
        """Evaluate the weights `version` that `engine` now holds: send `start`'s requests."""
        for request in self.start(version):
            await engine.submit(request)

    def add(self, piece: SampleOutput) -> EngineEval | None:
        """Route one eval piece; returns the running evaluation once all its prompts are done."""
        if self.running is not None and self.running.add(piece):
            return self.running
        return None

    def finished(self, evaluation: EngineEval, figures: dict[str, Any]) -> None:
        """`evaluation` is scored: its figures wait for the next step record."""
        if self.running is evaluation:
            self.running = None
        self._pending, self.last = figures, figures
        log.info("eval of version %d: pass@1 %.3f, mean reward %.3f over %d held-out prompts", evaluation.version,
                 figures["eval/pass_at_1"], figures["eval/mean_reward"], figures["eval/n"])

    def take_pending(self) -> dict[str, Any]:
        """The figures finished since the last call, once ({} when none)."""
        pending, self._pending = self._pending, {}
        return pending


class EngineEval:
    """One evaluation of the weights `version`: its requests, and its pieces as they stream in.

    `sampling`: every request's (greedy, one sample each, during training; `python -m
    jaxrl_async.eval` also runs a sampled pass of n samples per prompt). `episodes`: a multi-turn
    task's prompts are played as episodes (the engine is an EpisodeEngine, envs/engine.py) and
    each sample's reward is its episode's (runtime/scoring.py `episode_reward`).
    """

    def __init__(self, prompts: list[Prompt], version: int, sampling: SamplingParams, *,
                 episodes: bool = False) -> None:
        self.prompts, self.version, self.episodes = prompts, version, episodes
        self._sampling = sampling
        self._tokens = [[[] for _ in range(sampling.n)] for _ in prompts]  # per prompt, per sample
        self._records: dict[tuple[int, int], Any] = {}  # an episode's record, by (prompt, sample)
        self._done: set[tuple[int, int]] = set()
        self.min_version = version

    def request_id(self, index: int) -> str:
        return f"{EVAL_PREFIX}{self.version}.{index}"

    def requests(self) -> list[GenerationRequest]:
        return [GenerationRequest(self.request_id(i), list(p.prompt_ids), self._sampling, EVAL_PRIORITY,
                                  episode_of=p if self.episodes else None) for i, p in enumerate(self.prompts)]

    def add(self, piece: SampleOutput) -> bool:
        """Take one piece of this evaluation (others are ignored); True once every sample is done."""
        version, _, index = piece.request_id[len(EVAL_PREFIX):].partition(".")
        if int(version) != self.version:
            return False  # a late piece of an earlier evaluation
        key = (int(index), piece.sample_index)
        self._tokens[key[0]][key[1]] += piece.token_ids
        if piece.versions:
            self.min_version = min(self.min_version, min(v for v, _ in piece.versions))
        if piece.done:
            self._done.add(key)
            if piece.episode is not None:
                self._records[key] = piece.episode
        return len(self._done) == len(self.prompts) * self._sampling.n

    async def rewards(self, task: Task, tokenizer: Tokenizer) -> list[list[RewardResult]]:
        """Per prompt, each sample's reward: its episode's (runtime/scoring.py), else the task's of its text."""
        if self.episodes:
            return [[episode_reward(self._records.get((i, s))) for s in range(self._sampling.n)]
                    for i in range(len(self.prompts))]
        return await score_all(task, tokenizer, self.prompts, self._tokens)

    async def score(self, task: Task, tokenizer: Tokenizer, pass_threshold: float) -> dict[str, Any]:
        """The figures of the finished (greedy) evaluation, as `eval/<key>` metrics."""
        result = summarize(await self.rewards(task, tokenizer), None, pass_threshold)
        figures = result.to_json()
        return {f"eval/{k}": figures[k] for k in IN_TRAINING_KEYS} | {
            "eval/version": self.version, "eval/min_token_version": self.min_version}


def greedy_sampling(max_new_tokens: int, stop_token_ids: tuple[int, ...]) -> SamplingParams:
    """The greedy pass's sampling: one sample per prompt at temperature 0."""
    return SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0, stop_token_ids=stop_token_ids)


async def run_on_engine(engine: GenerationEngine, evaluation: EngineEval) -> EngineEval:
    """`evaluation` alone on `engine` (started, nothing else submitted): its requests sent and every
    piece read until it is done (`python -m jaxrl_async.eval`'s multi-turn passes)."""
    for request in evaluation.requests():
        await engine.submit(request)
    async for piece in engine.outputs():
        if evaluation.add(piece):
            return evaluation
    raise RuntimeError("the engine's stream ended before the evaluation was done")


# ------------------------------------------------------------------ decoding, scoring, the figures
# Shared by the evaluation during training (above, greedy only) and `python -m jaxrl_async.eval`.

# metrics.jsonl's `eval/<key>` figures (docs/design.md §8.3): the greedy pass's.
IN_TRAINING_KEYS = ("pass_at_1", "mean_reward", "n", "reward_errors")


@dataclass(frozen=True)
class EvalResult:
    """What an evaluation measured, from two decodings that measure different things: the greedy
    pass decodes every prompt once at temperature 0; the sampled pass (`samples=k > 1`) draws k
    completions per prompt at the sampling temperature. A completion passes when its reward is >=
    the threshold. `sampled_pass_at_k` may be below `greedy_pass_at_1`: at temperature 1 a small
    model's samples are often worse than its argmax, and pass@k counts the samples only."""

    greedy_pass_at_1: float  # greedy completions that pass / prompts
    greedy_mean_reward: float  # mean reward of the greedy completions
    n: int  # prompts scored
    reward_errors: int  # rewards that raised (scored 0.0), both passes
    samples: int  # k (1: the greedy pass only)
    sampled_mean_reward: float | None = None  # mean reward of all n·k sampled completions
    sampled_pass_at_k: float | None = None  # prompts with >= 1 passing sample among their k / prompts
    sampled_pass_at_1: float | None = None  # sampled completions that pass / (n·k): pass@1 at the temperature

    def to_json(self) -> dict[str, Any]:
        """The `output=json` object: docs/design.md §8.7's keys (`pass_at_1` = greedy_pass_at_1,
        `mean_reward` = greedy_mean_reward, `mean_at_k` = sampled_mean_reward, `pass_at_k` =
        sampled_pass_at_k; kept for the scripts that read them), then the names that say what each
        one measures."""
        out: dict[str, Any] = {"pass_at_1": self.greedy_pass_at_1, "mean_reward": self.greedy_mean_reward,
                               "n": self.n, "reward_errors": self.reward_errors, "samples": self.samples}
        if self.samples > 1:
            out.update(mean_at_k=self.sampled_mean_reward, pass_at_k=self.sampled_pass_at_k)
        out.update(greedy_pass_at_1=self.greedy_pass_at_1, greedy_mean_reward=self.greedy_mean_reward)
        if self.samples > 1:
            out.update(sampled_pass_at_1=self.sampled_pass_at_1, sampled_pass_at_k=self.sampled_pass_at_k,
                       sampled_mean_reward=self.sampled_mean_reward)
        return out


def decode_all(core: Any, prompts: list[Prompt], sampling: SamplingParams) -> list[list[list[int]]]:
    """Every prompt through `core` (an `EngineCore`) with `sampling`: per prompt, each sample's
    tokens in sample order. The core queues what does not fit its slots."""
    tokens: list[list[list[int]]] = [[[] for _ in range(sampling.n)] for _ in prompts]
    for i, prompt in enumerate(prompts):
        core.submit(GenerationRequest(str(i), list(prompt.prompt_ids), sampling))
    while core.has_work():
        for out in core.step():
            tokens[int(out.request_id)][out.sample_index] += out.token_ids
    return tokens


async def score_all(task: Task, tokenizer: Tokenizer, prompts: list[Prompt],
                    samples: list[list[list[int]]]) -> list[list[Any]]:
    """The task's reward of every sample (`samples[i]`: prompt i's samples' tokens): per prompt,
    one `RewardResult` per sample."""
    async def one(prompt, ids):
        return await task.reward(prompt, tokenizer.decode(ids), ids)

    return [await asyncio.gather(*(one(p, ids) for ids in ids_of_p)) for p, ids_of_p in zip(prompts, samples)]


def summarize(greedy: list[list[Any]], sampled: list[list[Any]] | None, threshold: float) -> EvalResult:
    """The greedy completions' (one per prompt) pass@1 and mean reward; the samples' mean reward,
    pass@k and per-sample pass rate."""
    first = [results[0] for results in greedy]
    errors = sum(r.error is not None for r in first)
    out = dict(greedy_pass_at_1=sum(r.value >= threshold for r in first) / len(first),
               greedy_mean_reward=sum(r.value for r in first) / len(first), n=len(first), samples=1)
    if sampled is not None:
        flat = [r for results in sampled for r in results]
        errors += sum(r.error is not None for r in flat)
        out.update(samples=len(sampled[0]), sampled_mean_reward=sum(r.value for r in flat) / len(flat),
                   sampled_pass_at_k=sum(any(r.value >= threshold for r in results) for results in sampled)
                   / len(sampled),
                   sampled_pass_at_1=sum(r.value >= threshold for r in flat) / len(flat))
    return EvalResult(reward_errors=errors, **out)
