"""The driver contract: how a driver applies a `Decision`, keeps token versions and reports a run.

A *driver* advances time and feeds a policy (`planner.base.Policy`) its events: the simulator
(`planner.sim.simulator`), the runtime (`jaxrl_async.runtime.controller`) and the test drivers
(`tests/helpers/scripted.py`, `tests/helpers/adversarial.py`). What they must do alike lives here,
once, so they cannot drift apart (docs/design.md §8):

1. **Applying a Decision** (docs/design.md §8.6). A driver implements `DecisionHost` — one query, `held`
   (what it holds of a uid), and four synchronous hooks — and hands every `Decision` to
   `apply_decision`, which checks it and calls the hooks in the documented order:

       moves     -> host.record_moves(moves)        the ledger's `move` lines
       drops     -> host.drop_group(drop)           a running group is aborted first
       the batch -> host.train_batch(uids)          only from select_batch; every uid done
       admits    -> host.admit_group(admission)     in list order; a candidate or a lost group

   A hook must not yield: a driver with asynchronous work (the runtime's engine calls) queues it
   in the hook and sends it once `apply_decision` has returned, so a decision is applied whole.
   Checks that depend on one driver's machinery (the simulator's "trainer busy") stay there.

2. **Token versions** (`VersionRuns`): the weight version of every sampled token, run-length
   encoded as `[[version, tokens], ...]`, adjacent runs on different versions — what engines
   stream and the ledger's `versions` sum up. `append_run`, `extend_runs`, `join_runs`,
   `encode_runs` / `decode_runs`, `tokens_by_version`; staleness histograms: `add_staleness`,
   `staleness_max`, `staleness_mean`.

3. **The run's files** (docs/design.md §8.1, §8.3): `summary` builds `summary.json` (the `SUMMARY_KEYS` in
   order, then the driver's extensions) and `step_record` one `metrics.jsonl` record (the
   `STEP_KEYS` in order, then the driver's extensions), so `planner.plots` reads any run.

To add a driver: implement `DecisionHost`, pass every Decision to `apply_decision`, keep token
versions with the run helpers, and write `summary(...)` / `step_record(...)` with your own
extensions after the common keys.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from planner.types import Admission, Decision, Drop, Move, Versions

# ====================================================================== applying a Decision


class Held(enum.Enum):
    """What a driver holds of a uid; `apply_decision`'s checks read nothing else."""

    NOTHING = "unknown"  # never offered, or already trained or dropped
    CANDIDATE = "a candidate"  # offered to `admit`, not admitted
    GENERATING = "generating"  # admitted and not done: queued, running, or being scored
    LOST = "lost"  # its worker died; it waits for a re-admission or a drop
    DONE = "done"  # generated (and scored): may be trained


UNTRAINED = frozenset({Held.GENERATING, Held.LOST, Held.DONE})  # what a drop may name
ADMISSIBLE = frozenset({Held.CANDIDATE, Held.LOST})  # what an admission may name
TRAINABLE = frozenset({Held.DONE})  # what a batch may name


@runtime_checkable
class DecisionHost(Protocol):
    """What a driver implements so that `apply_decision` can apply a policy's decisions."""

    def held(self, uid: int) -> Held: ...

    def record_moves(self, moves: list[Move]) -> None: ...

    def drop_group(self, drop: Drop) -> None: ...

    def train_batch(self, uids: list[int]) -> None: ...

    def admit_group(self, admission: Admission) -> None: ...


def apply_decision(host: DecisionHost, d: Decision, *, call: str, policy: str) -> None:
    """Apply `d`, returned by the policy's `call`, to `host` (docs/design.md §8.6): moves, drops, the
    batch, then the admissions in list order. `policy` names the policy in error messages.

    Raises ValueError, before the offending item is applied, on a batch from any call but
    `select_batch`, a batch naming a uid twice or a group that is not done, a drop of a group that
    is not admitted and untrained, and an admission of a uid that is neither a candidate nor a
    lost group (an admission earlier in the same list counts: a uid admitted twice is an error).
    """
    if d.moves:
        host.record_moves(d.moves)
    for drop in d.drop:
        _require(host, drop.uid, UNTRAINED, f"policy {policy} dropped uid {drop.uid} in {call}",
                 "not an admitted, untrained group")
        host.drop_group(drop)
    if d.train is not None:
        if call != "select_batch":
            raise ValueError(f"policy {policy}: {call} returned a batch; only select_batch may")
        if len(set(d.train)) != len(d.train):
            raise ValueError(f"policy {policy}: batch {d.train} names a uid twice")
        for uid in d.train:
            _require(host, uid, TRAINABLE, f"policy {policy} trained uid {uid}", "not done")
        host.train_batch(d.train)
    for a in d.admit:
        _require(host, a.uid, ADMISSIBLE, f"policy {policy} admitted uid {a.uid} in {call}",
                 "neither a candidate nor a lost group")
        host.admit_group(a)


def _require(host: DecisionHost, uid: int, allowed: frozenset[Held], what: str, rule: str) -> None:
    state = host.held(uid)
    if state not in allowed:
        raise ValueError(f"{what}: it is {state.value}, {rule}")


# ====================================================================== token versions

VersionRuns = list[list[int]]  # [[version, tokens], ...] in sampling order


def append_run(runs: VersionRuns, version: int, tokens: int = 1) -> None:
    """`tokens` more tokens sampled on `version`, at the end of `runs` (merged into its last run
    when that run has the same version). A new run is a new list: `runs` never aliases a caller's."""
    if runs and runs[-1][0] == version:
        runs[-1][1] += tokens
    else:
        runs.append([version, tokens])


def extend_runs(runs: VersionRuns, more: Iterable[Sequence[int]]) -> None:
    """Append the runs `more` (e.g. a streamed piece's) to `runs`, merging at the seam."""
    for version, tokens in more:
        append_run(runs, version, tokens)


def join_runs(pieces: Iterable[Iterable[Sequence[int]]]) -> VersionRuns:
    """The runs of consecutive pieces of one sample, as one list."""
    runs: VersionRuns = []
    for piece in pieces:
        extend_runs(runs, piece)
    return runs


def encode_runs(versions: Iterable[int]) -> VersionRuns:
    """Per-token versions -> runs."""
    runs: VersionRuns = []
    for version in versions:
        append_run(runs, version)
    return runs


def decode_runs(runs: Iterable[Sequence[int]]) -> list[int]:
    """Runs -> per-token versions."""
    return [version for version, tokens in runs for _ in range(tokens)]


def tokens_by_version(samples: Iterable[Iterable[Sequence[int]]]) -> Versions:
    """Tokens by version over the runs of several samples, oldest version first (a group's
    ledger `versions`, `Policy.on_group_finished`'s `versions`)."""
    counts: dict[int, int] = {}
    for runs in samples:
        for version, tokens in runs:
            counts[version] = counts.get(version, 0) + tokens
    return sorted(counts.items())


def add_staleness(hist: dict[int, int], step: int, versions: Iterable[Sequence[int]]) -> None:
    """Count tokens trained at `step` into `hist` by staleness (step − generation version)."""
    for version, tokens in versions:
        hist[step - version] = hist.get(step - version, 0) + tokens


def staleness_max(hist: Mapping[int, int]) -> int:
    """The largest staleness that has tokens (0 for an empty histogram)."""
    return max((s for s, t in hist.items() if t), default=0)


def staleness_mean(hist: Mapping[int, int]) -> float:
    """Token-weighted mean staleness (0.0 for an empty histogram)."""
    total = sum(hist.values())
    return sum(s * t for s, t in hist.items()) / total if total else 0.0


def hist_json(hist: Mapping[int, int]) -> dict[str, int]:
    """A staleness histogram as the run files write it: string keys, ascending staleness."""
    return {str(s): hist[s] for s in sorted(hist)}


# ====================================================================== the run's files

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
