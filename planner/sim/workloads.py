"""Response-length workloads: how long each trajectory of each group is (docs/design.md §4).

A workload draws, vectorized, a block of groups: prompt ids, prompt lengths and an `[G, n]` array
of response lengths. Every synthetic workload multiplies a per-prompt *difficulty* factor
(lognormal, `prompt_sigma`) into all n lengths of a group, so a group's lengths correlate the way
GRPO groups do (a hard prompt makes every sample long), and clips at `max_tokens`, which puts a
point mass at the limit: the truncated responses.

`workload=multi_turn` draws episodes: each sample alternates model turns and environment steps
(`EpisodeDraw`: tokens per turn, the latency of the environment step after each, and the fault
that ends it early, if any); its `lengths` are the tokens of each sample's turns summed. The
simulator runs each turn on an engine and waits out each environment step off the engine
(planner/sim/episodes.py).

To add a workload: subclass `Workload` with a frozen `Params` dataclass, implement `sample`,
decorate it with `@register`, and add `conf/workload/<name>.yaml` with `name: <name>`.
"""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from planner.configs import build, check
from planner.sim.trace import read_trace


@dataclass(frozen=True, slots=True)
class EpisodeDraw:
    """One sample of a multi-turn group: what its turns generate and its environment answers.

    Every model turn is followed by an environment step (the last one scores the episode); a
    step that fails ends the episode there: `turns` stops at the turn before it, whose tokens
    still train (the runtime never fabricates a reward, but the generated tokens are the group's).
    """

    turns: tuple[int, ...]  # tokens each model turn generates, in order
    env_s: tuple[float, ...]  # seconds of the environment step after each turn (a timeout: capped)
    reply_tokens: int  # tokens each environment reply appends to the context (prefill, KV)
    fault: str | None  # "error" | "timeout": the step after the last turn failed; None: it ended


@dataclass(frozen=True, slots=True)
class GroupDraws:
    """A block of G groups from the data stream."""

    prompt_ids: list[int | str]  # [G]
    prompt_tokens: np.ndarray  # [G] int64
    lengths: np.ndarray  # [G, n] int64 response tokens per trajectory
    episodes: list[list[EpisodeDraw]] | None = None  # [G][n] multi-turn workloads only


class Workload(ABC):
    name: ClassVar[str]
    Params: ClassVar[type]
    episodic: ClassVar[bool] = False  # draws multi-turn episodes (GroupDraws.episodes)

    def __init__(self, params: Any, group_size: int) -> None:
        self.params = params
        self.group_size = group_size
        self._next_prompt = 0
        self._tables: dict[str, np.ndarray] = {}  # per-prompt properties of a finite dataset
        self._table_seed: int | None = None
        n = getattr(params, "num_prompts", None)
        check(n is None or (isinstance(n, int) and not isinstance(n, bool) and n > 0), "workload.num_prompts", n,
              "must be a positive integer or null")

    @abstractmethod
    def sample(self, rng: np.random.Generator, num_groups: int) -> GroupDraws: ...

    def _prompt_ids(self, num_groups: int) -> np.ndarray:
        """Stream order; with `num_prompts` the dataset is revisited epoch after epoch (as in RL)."""
        first = self._next_prompt
        self._next_prompt += num_groups
        ids = np.arange(first, first + num_groups)
        n = getattr(self.params, "num_prompts", None)
        return ids % n if n else ids

    def _per_prompt(self, rng: np.random.Generator, ids: np.ndarray, key: str, draw) -> np.ndarray:
        """A random property of each prompt (difficulty, hardness), shape [G, 1].

        Fixed per prompt id when the workload has a finite dataset (`num_prompts`), so a prompt
        is as hard in every epoch — what a history length predictor relies on; fresh per group
        otherwise. `draw(rng, count)` returns a [count, 1] array.
        """
        n = getattr(self.params, "num_prompts", None)
        if not n:
            return draw(rng, len(ids))
        if self._table_seed is None:
            self._table_seed = int(rng.integers(2**32))
        if key not in self._tables:
            self._tables[key] = draw(np.random.default_rng([self._table_seed, len(self._tables)]), n)
        return self._tables[key][ids]

    def _finish(self, rng: np.random.Generator, ids: np.ndarray, raw: np.ndarray, max_tokens: int,
                prompt_tokens: int) -> GroupDraws:
        """Scale by prompt difficulty, round up and clip to [1, max_tokens]."""
        sigma = self.params.prompt_sigma
        difficulty = self._per_prompt(rng, ids, "difficulty", lambda r, g: r.lognormal(0.0, sigma, size=(g, 1)))
        lengths = np.clip(np.ceil(raw * difficulty), 1, max_tokens).astype(np.int64)
        return GroupDraws(ids.tolist(), np.full(len(ids), prompt_tokens, dtype=np.int64), lengths)


def _check_bounds(params: Any, *, positive: tuple[str, ...] = (), nonnegative: tuple[str, ...] = ()) -> None:
    """`workload.<name>` of `params` must be > 0 (`positive`) or >= 0 (`nonnegative`)."""
    for name in positive:
        check(getattr(params, name) > 0, f"workload.{name}", getattr(params, name), "must be > 0")
    for name in nonnegative:
        check(getattr(params, name) >= 0, f"workload.{name}", getattr(params, name), "must be >= 0")


WORKLOADS: dict[str, type[Workload]] = {}


def register(cls: type[Workload]) -> type[Workload]:
    if cls.name in WORKLOADS:
        raise ValueError(f"workload '{cls.name}' registered twice")
    WORKLOADS[cls.name] = cls
    return cls


@dataclass(frozen=True)
class LognormalParams:
    """`workload=lognormal`: response lengths log-normal around a per-prompt median.

    Attributes:
      mu: log-median response length (e^6 ≈ 400 tokens)
      sigma: spread within a group
      prompt_sigma: spread of the per-prompt difficulty factor (group correlation)
      max_tokens: truncation limit: lengths are clipped here
      prompt_tokens: prompt length of every group
      num_prompts: dataset size; null = every prompt new
    """

    mu: float = 6.0
    sigma: float = 0.6
    prompt_sigma: float = 0.5
    max_tokens: int = 4096
    prompt_tokens: int = 256
    num_prompts: int | None = None

    def __post_init__(self) -> None:
        _check_bounds(self, positive=("max_tokens",), nonnegative=("sigma", "prompt_sigma", "prompt_tokens"))


@register
class Lognormal(Workload):
    name = "lognormal"
    Params = LognormalParams

    def sample(self, rng: np.random.Generator, num_groups: int) -> GroupDraws:
        p = self.params
        ids = self._prompt_ids(num_groups)
        raw = rng.lognormal(p.mu, p.sigma, size=(num_groups, self.group_size))
        return self._finish(rng, ids, raw, p.max_tokens, p.prompt_tokens)


@dataclass(frozen=True)
class BimodalParams:
    """`workload=bimodal`: easy and hard prompts, each group all short or all long.

    Attributes:
      short_mean: median length of an easy prompt's responses
      long_mean: median length of a hard prompt's responses
      p_long: fraction of hard prompts (the whole group is long)
      sigma: spread within a group
      prompt_sigma: spread of the per-prompt difficulty factor (group correlation)
      max_tokens: truncation limit: lengths are clipped here
      prompt_tokens: prompt length of every group
      num_prompts: dataset size; null = every prompt new
    """

    short_mean: float = 300.0
    long_mean: float = 2500.0
    p_long: float = 0.2
    sigma: float = 0.3
    prompt_sigma: float = 0.2
    max_tokens: int = 4096
    prompt_tokens: int = 256
    num_prompts: int | None = None

    def __post_init__(self) -> None:
        _check_bounds(self, positive=("short_mean", "long_mean", "max_tokens"),
                      nonnegative=("sigma", "prompt_sigma", "prompt_tokens"))
        check(0 <= self.p_long <= 1, "workload.p_long", self.p_long, "must be in [0, 1]")


@register
class Bimodal(Workload):
    name = "bimodal"
    Params = BimodalParams

    def sample(self, rng: np.random.Generator, num_groups: int) -> GroupDraws:
        p = self.params
        ids = self._prompt_ids(num_groups)
        hard = self._per_prompt(rng, ids, "hard", lambda r, g: r.random((g, 1)) < p.p_long)
        mu = np.where(hard, np.log(p.long_mean), np.log(p.short_mean))
        raw = np.exp(mu + p.sigma * rng.standard_normal((num_groups, self.group_size)))
        return self._finish(rng, ids, raw, p.max_tokens, p.prompt_tokens)


@dataclass(frozen=True)
class HeavyTailParams:
    """`workload=heavy_tail`: Pareto response lengths, a few very long.

    Attributes:
      scale: Pareto (type I) minimum length
      alpha: tail index: smaller = heavier tail
      prompt_sigma: spread of the per-prompt difficulty factor (group correlation)
      max_tokens: truncation limit: lengths are clipped here
      prompt_tokens: prompt length of every group
      num_prompts: dataset size; null = every prompt new
    """

    scale: float = 200.0
    alpha: float = 1.5
    prompt_sigma: float = 0.3
    max_tokens: int = 8192
    prompt_tokens: int = 256
    num_prompts: int | None = None

    def __post_init__(self) -> None:
        _check_bounds(self, positive=("scale", "alpha", "max_tokens"), nonnegative=("prompt_sigma", "prompt_tokens"))


@register
class HeavyTail(Workload):
    name = "heavy_tail"
    Params = HeavyTailParams

    def sample(self, rng: np.random.Generator, num_groups: int) -> GroupDraws:
        p = self.params
        ids = self._prompt_ids(num_groups)
        raw = p.scale * (1.0 + rng.pareto(p.alpha, size=(num_groups, self.group_size)))
        return self._finish(rng, ids, raw, p.max_tokens, p.prompt_tokens)


@dataclass(frozen=True)
class TraceParams:
    """`workload=trace`: lengths replayed from a recorded run's JSONL trace.

    Attributes:
      path: JSONL trace (docs/design.md §8); cycled when the run needs more groups; required
      prompt_tokens: for lines without "prompt_tokens"
    """

    path: str
    prompt_tokens: int = 256

    def __post_init__(self) -> None:
        if not self.path:
            raise ValueError("workload.path: required for workload=trace (a JSONL trace file)")
        _check_bounds(self, nonnegative=("prompt_tokens",))


@register
class Trace(Workload):
    """Replays a trace in file order, cycling; the random generator is not used."""

    name = "trace"
    Params = TraceParams

    def __init__(self, params: TraceParams, group_size: int) -> None:
        super().__init__(params, group_size)
        groups = read_trace(params.path, group_size)
        self._prompt_ids_all = [g.prompt_id for g in groups]
        self._prompt_tokens = np.array(
            [params.prompt_tokens if g.prompt_tokens is None else g.prompt_tokens for g in groups], dtype=np.int64
        )
        self._lengths = np.array([g.lengths for g in groups], dtype=np.int64)
        self._pos = 0

    def sample(self, rng: np.random.Generator, num_groups: int) -> GroupDraws:
        idx = (self._pos + np.arange(num_groups)) % len(self._lengths)
        self._pos = int((self._pos + num_groups) % len(self._lengths))
        return GroupDraws([self._prompt_ids_all[i] for i in idx.tolist()], self._prompt_tokens[idx], self._lengths[idx])


@dataclass(frozen=True)
class MultiTurnParams:
    """`workload=multi_turn`: episodes of model turns and environment steps (tools, games, sandboxes).

    Each sample draws its turns, 1 + Poisson(turns_mean − 1) capped at max_turns; each turn's
    tokens, log-normal (turn_mu, turn_sigma) times a per-prompt difficulty factor (prompt_sigma),
    in [1, max_turn_tokens]; the latency of the environment step after each turn, a log-normal body
    (env_mu, env_sigma) with probability 1 − env_tail_p, else a Pareto (type I) tail from
    env_tail_scale with index env_tail_alpha; a step longer than env_timeout_s is killed there and
    fails ("timeout"); any step fails with probability env_fail_p ("error"). A failed step ends
    the episode.

    Attributes:
      turns_mean: mean model turns per episode (1 + Poisson(turns_mean - 1))
      max_turns: most model turns an episode may take
      turn_mu: log-median tokens a model turn generates (e^5 ≈ 150 tokens)
      turn_sigma: spread of a turn's tokens
      max_turn_tokens: truncation limit of one turn's tokens
      prompt_sigma: spread of the per-prompt difficulty factor on tokens (group correlation)
      env_mu: log-median seconds of an environment step (the log-normal body)
      env_sigma: spread of the log-normal body
      env_tail_p: share of environment steps drawn from the Pareto tail
      env_tail_scale: s: the Pareto tail's minimum
      env_tail_alpha: the Pareto tail's index: smaller = heavier
      env_timeout_s: s: a step still running then is killed and fails (timeout); null = never
      env_fail_p: probability that an environment step fails (error) and ends the episode
      reply_tokens: tokens an environment reply appends to the episode's context
      prompt_tokens: prompt length of every group
      num_prompts: dataset size; null = every prompt new
    """

    turns_mean: float = 4.0
    max_turns: int = 10
    turn_mu: float = 5.0
    turn_sigma: float = 0.6
    max_turn_tokens: int = 1024
    prompt_sigma: float = 0.3
    env_mu: float = 0.0
    env_sigma: float = 0.5
    env_tail_p: float = 0.05
    env_tail_scale: float = 5.0
    env_tail_alpha: float = 1.5
    env_timeout_s: float | None = 60.0
    env_fail_p: float = 0.02
    reply_tokens: int = 64
    prompt_tokens: int = 256
    num_prompts: int | None = None

    def __post_init__(self) -> None:
        _check_bounds(self, positive=("max_turns", "max_turn_tokens", "env_tail_scale", "env_tail_alpha"),
                      nonnegative=("turn_sigma", "prompt_sigma", "env_sigma", "reply_tokens", "prompt_tokens"))
        check(1 <= self.turns_mean <= self.max_turns, "workload.turns_mean", self.turns_mean,
              f"must be in [1, max_turns={self.max_turns}]")
        for name in ("env_tail_p", "env_fail_p"):
            check(0 <= getattr(self, name) <= 1, f"workload.{name}", getattr(self, name), "must be in [0, 1]")
        check(self.env_timeout_s is None or self.env_timeout_s > 0, "workload.env_timeout_s", self.env_timeout_s,
              "must be > 0, or null for no timeout")


@register
class MultiTurn(Workload):
    """Draws every sample's episode at once, vectorized over [G, n, max_turns]: turns past a
    sample's count or past its first failed step are cut."""

    name = "multi_turn"
    Params = MultiTurnParams
    episodic = True

    def sample(self, rng: np.random.Generator, num_groups: int) -> GroupDraws:
        p = self.params
        g, n, k = num_groups, self.group_size, p.max_turns
        ids = self._prompt_ids(num_groups)
        count = np.minimum(k, 1 + rng.poisson(p.turns_mean - 1, size=(g, n)))
        difficulty = self._per_prompt(rng, ids, "difficulty", lambda r, m: r.lognormal(0.0, p.prompt_sigma, (m, 1)))
        tokens = np.clip(np.ceil(rng.lognormal(p.turn_mu, p.turn_sigma, (g, n, k)) * difficulty[:, :, None]),
                         1, p.max_turn_tokens).astype(np.int64)
        tail = rng.random((g, n, k)) < p.env_tail_p
        env = np.where(tail, p.env_tail_scale * (1.0 + rng.pareto(p.env_tail_alpha, (g, n, k))),
                       rng.lognormal(p.env_mu, p.env_sigma, (g, n, k)))
        error = rng.random((g, n, k)) < p.env_fail_p
        timeout = env > p.env_timeout_s if p.env_timeout_s is not None else np.zeros_like(error)
        if p.env_timeout_s is not None:
            env = np.minimum(env, p.env_timeout_s)
        failed = (error | timeout) & (np.arange(k) < count[:, :, None])
        # A failed step ends the episode after its turn: the first failure cuts the count.
        first = np.where(failed.any(axis=2), failed.argmax(axis=2) + 1, k + 1)
        turns = np.minimum(count, first)
        episodes, lengths = [], np.zeros((g, n), dtype=np.int64)
        for i in range(g):
            row = []
            for j in range(n):
                t = int(turns[i, j])
                fault = None
                if first[i, j] <= count[i, j]:
                    fault = "timeout" if timeout[i, j, t - 1] else "error"
                row.append(EpisodeDraw(tuple(tokens[i, j, :t].tolist()), tuple(env[i, j, :t].tolist()),
                                       p.reply_tokens, fault))
                lengths[i, j] = tokens[i, j, :t].sum()
            episodes.append(row)
        return GroupDraws(ids.tolist(), np.full(g, p.prompt_tokens, dtype=np.int64), lengths, episodes)


def make_workload(values: Mapping[str, Any], group_size: int) -> Workload:
    """Build from a `conf/workload/*.yaml` mapping: `name` picks the class, the rest are its params."""
    values = dict(values)
    name = values.pop("name", None)
    if name not in WORKLOADS:
        raise ValueError(f"workload={name}: unknown workload (known: {', '.join(sorted(WORKLOADS))})")
    cls = WORKLOADS[name]
    return cls(build(cls.Params, values, "workload"), group_size)


def workload_params(workload: Workload) -> dict[str, Any]:
    return {"name": workload.name, **dataclasses.asdict(workload.params)}
