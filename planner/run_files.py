"""The run's files (docs/design.md §8.1, §8.3): what every driver writes, with the same keys.

`summary` builds `summary.json` (the `SUMMARY_KEYS` in order, then the driver's extensions) and
`step_record` one `metrics.jsonl` record (the `STEP_KEYS` in order, then the driver's
extensions), so `planner.plots` reads any run. The simulator (`planner.sim.metrics`) and the
runtime (`jaxrl_async.runtime.metrics`) both build their records here, so their keys cannot drift.

To add a key common to both drivers: add it to `SUMMARY_KEYS` or `STEP_KEYS` and to the builder;
a driver's own key goes in its `extensions`, after the common ones (the files change only by
extension, docs/design.md §8).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from planner.versions import staleness_max, staleness_mean

SUMMARY_FILE = "summary.json"
METRICS_FILE = "metrics.jsonl"

# summary.json (docs/design.md §8.1): these first, in this order, from every driver.
SUMMARY_KEYS = (
    "policy", "max_staleness", "staleness_bound", "steps", "groups_admitted", "groups_trained", "groups_dropped",
    "tokens_trained", "tokens_wasted", "max_token_staleness", "mean_token_staleness",
    "staleness_histogram", "elapsed_s", "trainer_busy_fraction", "generator_busy_fraction",
    "steps_per_hour", "steps_per_hour_steady",
)

# metrics.jsonl (docs/design.md §8.3): one record per trainer step, these first, in this order.
STEP_KEYS = (
    "step",  # the trainer step
    "reward_mean",  # mean reward of the batch; null in the simulator (no model)
    "loss",  # the step's loss; null in the simulator
    "max_staleness_in_batch",
    "tokens_per_s",  # tokens trained in this step / seconds since the previous step's record
    "version",  # the version published after the step (step + 1)
    "mean_staleness_in_batch",
    "tokens_trained",  # response tokens in the batch
    "wait_s",  # the trainer waited this long for the batch
    "start_s",  # run seconds when the step began training
    "end_s",  # run seconds when it ended
    "elapsed_s",  # run seconds at the record (simulated seconds in the simulator)
    "trainer_busy",  # fraction of the run so far the trainer trained
    "generator_busy",  # fraction of the run so far the average generator generated
    "gen_active",  # active sequences per generator at the record (-1: a dead worker)
    "kv_usage",  # generator load in [0, 1] at the record (KV or slots in use)
    "staleness_hist",  # trained tokens by staleness, the run so far
)


def hist_json(hist: Mapping[int, int]) -> dict[str, int]:
    """A staleness histogram as the run files write it: string keys, ascending staleness."""
    return {str(s): hist[s] for s in sorted(hist)}


_TINY = 1e-12  # guards a division by an elapsed time of zero (a run that ended at once)
# The steady state starts after this many steps: a real run's first steps compile the jitted
# steps (docs/calibration.md), seconds that say nothing about the steady rate.
STEADY_AFTER = 3


def steady_steps_per_hour(record_s: Sequence[float], warmup: int = STEADY_AFTER) -> float | None:
    """Steps per hour of the steady state: the steps after the first `warmup`, over the run seconds
    from step `warmup − 1`'s metrics record to the last record. `record_s`: each step's record
    time (`metrics.jsonl` `elapsed_s`), in step order, whole run. None when the run has no step
    after the warm-up. Both drivers' summaries and `planner.fidelity` measure it this way, so a
    run and its replay compare the same window.
    """
    if len(record_s) <= warmup:
        return None
    start = record_s[warmup - 1] if warmup else 0.0
    return (len(record_s) - warmup) / max(record_s[-1] - start, _TINY) * 3600.0


def summary(*, policy: str, max_staleness: int | None, staleness_bound: int | None, steps: int, groups_admitted: int, groups_trained: int,
            groups_dropped: int, tokens_wasted: int, staleness: Mapping[int, int], elapsed_s: float,
            trainer_busy_s: float, generator_busy_s: float, record_s: Sequence[float],
            extensions: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The `summary.json` object: `SUMMARY_KEYS` in order, then `extensions`.

    `staleness`: trained tokens by staleness (the run's whole histogram; `tokens_trained` is its
    sum). `generator_busy_s`: busy seconds of the average generator. `elapsed_s`: simulated
    seconds in simulation, wall seconds in training. `staleness_bound`: the policy's own claim
    (`Policy.staleness_bound()`: η when strict, a looser bound for torchtitan's windowed FIFO,
    None when it claims none), which `planner.audit` checks by default. `record_s`: each step's
    `metrics.jsonl` record time, whole run: `steps_per_hour` spans the whole run (warm-up and
    compilation included), `steps_per_hour_steady` the steady state (`steady_steps_per_hour`).
    """
    elapsed = max(elapsed_s, _TINY)
    out = {
        "policy": policy,
        "max_staleness": max_staleness,
        "staleness_bound": staleness_bound,
        "steps": steps,
        "groups_admitted": groups_admitted,
        "groups_trained": groups_trained,
        "groups_dropped": groups_dropped,
        "tokens_trained": sum(staleness.values()),
        "tokens_wasted": tokens_wasted,
        "max_token_staleness": staleness_max(staleness),
        "mean_token_staleness": staleness_mean(staleness),
        "staleness_histogram": hist_json(staleness),
        "elapsed_s": elapsed_s,
        "trainer_busy_fraction": min(1.0, trainer_busy_s / elapsed),
        "generator_busy_fraction": min(1.0, generator_busy_s / elapsed),
        "steps_per_hour": steps / elapsed * 3600.0,
        "steps_per_hour_steady": steady_steps_per_hour(record_s),
    }
    out.update(extensions or {})
    return out


def step_record(*, step: int, reward_mean: float | None, loss: float | None, batch: Mapping[int, int],
                cycle_s: float, wait_s: float, start_s: float, end_s: float, elapsed_s: float,
                trainer_busy_s: float, generator_busy_s: float, gen_active: Sequence[int], kv_usage: float,
                staleness: Mapping[int, int], extensions: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """One `metrics.jsonl` record: `STEP_KEYS` in order, then `extensions`.

    `batch`: the step's trained tokens by staleness; `cycle_s`: seconds since the previous step's
    record (since the run began for the first), so that `tokens_per_s` is the trained-token
    throughput of the step's whole cycle — waiting, training, publishing. `trainer_busy_s`,
    `generator_busy_s` (the average generator's) and `staleness` are totals of the run so far.
    """
    tokens = sum(batch.values())
    elapsed = max(elapsed_s, _TINY)
    out = {
        "step": step,
        "reward_mean": reward_mean,
        "loss": loss,
        "max_staleness_in_batch": staleness_max(batch),
        "tokens_per_s": tokens / max(cycle_s, _TINY),
        "version": step + 1,
        "mean_staleness_in_batch": staleness_mean(batch),
        "tokens_trained": tokens,
        "wait_s": wait_s,
        "start_s": start_s,
        "end_s": end_s,
        "elapsed_s": elapsed_s,
        "trainer_busy": trainer_busy_s / elapsed,
        "generator_busy": generator_busy_s / elapsed,
        "gen_active": list(gen_active),
        "kv_usage": kv_usage,
        "staleness_hist": hist_json(staleness),
    }
    out.update(extensions or {})
    return out
