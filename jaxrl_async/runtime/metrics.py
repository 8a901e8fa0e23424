"""Run statistics, the per-step metric sinks, and `summary.json` (docs/design.md §8).

`RunStats` accumulates what the summary reports — counts, the staleness histogram of trained
tokens, busy seconds of the trainer and of the generator — and is saved in checkpoints so that a
resumed run reports the whole run. Every optimizer step produces one flat record that goes to
every `MetricsSink`: `metrics.jsonl`, TensorBoard, the progress display. Both files are built by
`planner.run_files` (`summary`, `step_record`) with the training run's extensions after the common
keys, so the simulator's runs and these share their keys and `planner.plots` reads both.

How to add a sink: implement `write(record)` and `close()`; pass it to the controller.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from planner import run_files
from planner.jsonl import read_jsonl_lines
from planner.run_files import METRICS_FILE, SUMMARY_FILE  # noqa: F401  (the runtime's modules import them here)

if TYPE_CHECKING:
    from jaxrl_async.engines.base import EngineStats, EngineTiming


class MetricsSink(Protocol):
    def write(self, record: dict[str, Any]) -> None: ...
    def close(self) -> None: ...


@dataclass
class RunStats:
    """Totals over the whole run (all segments of a resumed run)."""

    elapsed_s: float = 0.0  # wall seconds of earlier segments (the current one is added live)
    trainer_busy_s: float = 0.0
    generator_busy_s: float = 0.0
    overlap_s: float = 0.0  # generator busy while a train step ran: the asynchrony, measured
    steps_done: int = 0
    steps_skipped: int = 0  # non-finite loss or gradient: update skipped, weights unchanged
    groups_admitted: int = 0  # first admissions (re-admissions after a fault excluded)
    groups_readmitted: int = 0
    groups_trained: int = 0
    groups_dropped: int = 0
    groups_stalled: int = 0  # attempts aborted by the stall watchdog and regenerated (runtime/liveness.py)
    groups_migrated: int = 0  # running groups moved to a less loaded engine replica (runtime/tail.py)
    # The engine's decode iterations (`EngineTiming`, drained at every step end) and what speculative
    # decoding did in them: 0 iterations means the engine times none (vLLM, Ray workers), so its
    # speculation could not be counted.
    engine_iterations: int = 0
    speculation_drafted_tokens: int = 0
    speculation_accepted_tokens: int = 0  # of the drafted tokens, those the verification kept
    speculating_sequences: int = 0  # sequences that drafted, summed over the iterations
    tokens_generated: int = 0
    tokens_trained: int = 0
    tokens_wasted: int = 0  # generated tokens of dropped groups
    rewards_scored: int = 0
    reward_errors: int = 0  # reward function raised / timed out / returned garbage -> 0.0
    reward_errors_by_type: Counter = field(default_factory=Counter)  # kind (timeout, ValueError, ...) -> count
    pushes: int = 0  # weight pushes to the engines
    push_s: float = 0.0  # their seconds: trainer layout -> engine layout, until every engine holds them
    push_max_s: float = 0.0
    last_push_s: float = 0.0
    staleness: Counter = field(default_factory=Counter)  # staleness -> trained tokens
    # Multi-turn tasks (envs/): episodes played to their end or fault, their model turns, the
    # environment's tokens and seconds, and the faults that ended episodes, by kind.
    episodes: int = 0
    episode_turns: int = 0
    env_tokens: int = 0
    env_s: float = 0.0
    episode_faults: int = 0
    episode_faults_by_kind: Counter = field(default_factory=Counter)

    def add_push(self, seconds: float) -> None:
        self.pushes += 1
        self.push_s += seconds
        self.push_max_s = max(self.push_max_s, seconds)
        self.last_push_s = seconds

    def add_batch(self, hist: dict[int, int]) -> None:
        self.staleness.update(hist)
        self.tokens_trained += sum(hist.values())

    def add_iterations(self, timings: Iterable[EngineTiming]) -> None:
        """Count the engine's decode iterations and their speculation (`GenerationEngine.timings()`)."""
        for t in timings:
            if t.kind == "decode":
                self.engine_iterations += 1
                self.speculation_drafted_tokens += t.drafted
                self.speculation_accepted_tokens += t.accepted
                self.speculating_sequences += t.speculating

    def to_json(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["staleness"] = {str(s): t for s, t in sorted(self.staleness.items())}
        d["reward_errors_by_type"] = dict(sorted(self.reward_errors_by_type.items()))
        d["episode_faults_by_kind"] = dict(sorted(self.episode_faults_by_kind.items()))
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> RunStats:
        d = dict(d)
        d["staleness"] = Counter({int(s): int(t) for s, t in d["staleness"].items()})
        d["reward_errors_by_type"] = Counter(d.get("reward_errors_by_type", {}))
        d["episode_faults_by_kind"] = Counter(d.get("episode_faults_by_kind", {}))
        return cls(**d)

    def add_episodes(self, samples: Iterable[Any]) -> None:
        """Count the episodes of a finished group's samples (runtime/rollouts.py RolloutSample)."""
        for s in samples:
            record = s.episode
            if record is None:
                continue
            self.episodes += 1
            self.episode_turns += len(record.turns)
            self.env_tokens += len(s.loss_mask) - sum(s.loss_mask)
            self.env_s += sum(t[2] for t in record.turns)
            if record.fault_kind is not None:
                self.episode_faults += 1
                self.episode_faults_by_kind[record.fault_kind] += 1


@dataclass(frozen=True)
class RunResult:
    """What a run (a segment of it) ends with: summary.json is written from it (job/report.py)."""

    steps_done: int
    completed: bool  # all `steps` trained (False: stopped for a checkpoint)
    stats: RunStats
    elapsed_s: float
    trainer_busy_s: float
    generator_busy_s: float


def tail_counts(stats: RunStats) -> dict[str, Any]:
    """What the tail's mechanisms did, the run so far (docs/design.md §2.14, §8.1): groups migrated,
    tokens drafted and accepted by speculative decoding, its acceptance rate (null: nothing
    drafted) and the sequences that drafted, summed over iterations. The speculation counts are
    null when the engine times no iteration (vLLM, Ray workers): unknown, not zero."""
    counted = stats.engine_iterations > 0
    drafted, accepted = stats.speculation_drafted_tokens, stats.speculation_accepted_tokens
    return {
        "groups_migrated": stats.groups_migrated,
        "speculation_drafted_tokens": drafted if counted else None,
        "speculation_accepted_tokens": accepted if counted else None,
        "speculation_acceptance": accepted / drafted if counted and drafted else None,
        "speculating_sequences": stats.speculating_sequences if counted else None,
    }


def episode_counts(stats: RunStats) -> dict[str, Any]:
    """What the multi-turn machinery did (summary.json): episodes, their turns, the environment's
    tokens and seconds, and the faults that ended episodes by kind (all 0 for a single-turn task)."""
    return {
        "episodes": stats.episodes, "episode_turns": stats.episode_turns, "env_tokens": stats.env_tokens,
        "env_s": round(stats.env_s, 3), "episode_faults": stats.episode_faults,
        "episode_faults_by_kind": dict(sorted(stats.episode_faults_by_kind.items())),
    }


@dataclass(frozen=True)
class StepTiming:
    wait_s: float  # the trainer waited this long for the batch (idle)
    train_s: float  # the optimizer step
    overlap_s: float  # of `train_s`, the engine was generating this long
    start_s: float  # run seconds when the step began training
    end_s: float  # run seconds when it ended


@dataclass(frozen=True)
class EngineLoad:
    """The engine at the record: active sequences per replica, and slots in use in [0, 1]."""

    active: list[int]
    usage: float

    @classmethod
    def of(cls, stats: EngineStats) -> EngineLoad:
        """Active sequences per replica (one entry for a single engine) and slots in use."""
        return cls(list(stats.extra.get("per_replica_active", [stats.active_slots])),
                   stats.active_slots / max(1, stats.total_slots))


def step_record(step: int, metrics: dict[str, float], hist: dict[int, int], lengths: list[int], stats: RunStats,
                timing: StepTiming, *, previous: tuple[float, int], engine: EngineLoad, inflight_groups: int,
                done_groups: int, eta_s: float) -> dict[str, Any]:
    """The `metrics.jsonl` record of step `step`: `planner.run_files.step_record`'s keys, then the
    training run's. `metrics` is the trainer's; `hist` the batch's tokens by staleness; `stats`
    the run so far; `previous` (run seconds, tokens generated) at the previous record."""
    prev_s, prev_generated = previous
    cycle_s = stats.elapsed_s - prev_s
    return run_files.step_record(
        step=step, reward_mean=metrics["reward_mean"], loss=metrics["loss"], batch=hist, cycle_s=cycle_s,
        wait_s=timing.wait_s, start_s=timing.start_s, end_s=timing.end_s, elapsed_s=stats.elapsed_s,
        trainer_busy_s=stats.trainer_busy_s, generator_busy_s=stats.generator_busy_s, gen_active=engine.active,
        kv_usage=engine.usage, staleness=stats.staleness,
        extensions={
            "generated_tokens_per_s": (stats.tokens_generated - prev_generated) / max(cycle_s, 1e-9),
            "response_len_mean": sum(lengths) / max(1, len(lengths)),
            "skipped": int(metrics["skipped"]),
            "train_s": timing.train_s,
            "generator_busy_in_step": timing.overlap_s / max(timing.train_s, 1e-9),
            "inflight_groups": inflight_groups,
            "done_groups": done_groups,
            "reward_errors": stats.reward_errors,
            "groups_stalled": stats.groups_stalled,
            **tail_counts(stats),
            "push_s": stats.last_push_s,  # the latest weight push (after the previous step)
            "eta_s": eta_s,
            **{f"train/{k}": v for k, v in metrics.items() if k not in ("reward_mean", "loss", "skipped")},
        })


def record_times(path: Path) -> list[float]:
    """Each step's record time (`elapsed_s`) in `metrics.jsonl`, whole run (a resume continues
    the file), for `summary`'s steady-state steps/h; [] when the file is missing."""
    if not path.is_file():
        return []
    return [row["elapsed_s"] for _, row in read_jsonl_lines(path)]


def summary(stats: RunStats, *, policy: str, max_staleness: int | None, staleness_bound: int | None, elapsed_s: float,
            trainer_busy_s: float, generator_busy_s: float, record_s: list[float],
            extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """The `summary.json` object: `planner.run_files.summary`'s keys, then the training run's
    extensions, then `extra`. `record_s`: `record_times` of the run's metrics file."""
    return run_files.summary(
        policy=policy, max_staleness=max_staleness, staleness_bound=staleness_bound, steps=stats.steps_done, groups_admitted=stats.groups_admitted,
        groups_trained=stats.groups_trained, groups_dropped=stats.groups_dropped, tokens_wasted=stats.tokens_wasted,
        staleness=stats.staleness, elapsed_s=elapsed_s, trainer_busy_s=trainer_busy_s,
        generator_busy_s=generator_busy_s, record_s=record_s,
        extensions={
            "overlap_fraction": stats.overlap_s / max(stats.trainer_busy_s, 1e-9),
            "steps_skipped": stats.steps_skipped,
            "groups_readmitted": stats.groups_readmitted,
            "tokens_generated": stats.tokens_generated,
            "reward_errors": stats.reward_errors,
            "reward_errors_by_type": dict(sorted(stats.reward_errors_by_type.items())),
            "groups_stalled": stats.groups_stalled,
            **tail_counts(stats),
            **episode_counts(stats),
            "rewards_scored": stats.rewards_scored,
            "weight_push_s_mean": stats.push_s / max(1, stats.pushes),
            "weight_push_s_max": stats.push_max_s,
            **(extra or {}),
        })


def write_json(path: Path, obj: Any) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(obj, indent=1) + "\n")
    tmp.replace(path)


class JsonlSink:
    """`metrics.jsonl`: one object per step, appended (a resumed run continues the file). Each
    record is written whole and synced to disk at once (one a step), so a kill loses at most the
    record being written; a torn one is cut off by the resume (`checkpoint.truncate`)."""

    def __init__(self, path: Path, *, append: bool) -> None:
        self.path = path
        self._fh = open(path, "a" if append else "w", encoding="utf-8")
        self._failed = False

    def write(self, record: dict[str, Any]) -> None:
        clean = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in record.items()}
        try:
            self._fh.write(json.dumps(clean) + "\n")
            self._fh.flush()
            os.fsync(self._fh.fileno())
        except OSError as e:  # a full disk: the error names the file (the OS's names none)
            self._failed = True
            raise OSError(e.errno, e.strerror, str(self.path)) from None

    def close(self) -> None:
        """Close; after a failed write, quietly (the record that failed is dropped, the error was raised)."""
        try:
            self._fh.close()
        except OSError:
            if not self._failed:
                raise


class TensorBoardSink:
    """Scalars of every step in one event file under `run_dir/tb/` (tensorboardX's record format;
    no TensorFlow needed), written and flushed in the caller's thread, one flush a step.

    Not tensorboardX's `SummaryWriter`: its background thread dies on a full disk with a
    traceback naming no file, and its bounded queue then blocks the run's next write for ever.
    Here a failed write is an OSError naming the event file, raised in the step that hit it; once
    one was raised, `close` drops what could not be written without raising again (the run is
    already ending on the first error, which the user sees as one line)."""

    def __init__(self, logdir: Path) -> None:
        import socket
        import time

        from tensorboardX.record_writer import RecordWriter

        logdir.mkdir(parents=True, exist_ok=True)
        self.path = logdir / f"events.out.tfevents.{int(time.time())}.{socket.gethostname()}"
        self._failed = False
        with self._naming_the_file():
            self._records = RecordWriter(str(self.path))
            self._write_event(file_version="brain.Event:2")
            self._records.flush()

    def write(self, record: dict[str, Any]) -> None:
        from tensorboardX.summary import scalar

        step = int(record["step"])
        with self._naming_the_file():
            for key, value in record.items():
                if key != "step" and isinstance(value, (int, float)) and not isinstance(value, bool):
                    self._write_event(step=step, summary=scalar(key, value))
            self._records.flush()

    def close(self) -> None:
        if self._failed:
            try:
                self._records.close()
            except OSError:
                pass
            return
        with self._naming_the_file():
            self._records.close()

    def _write_event(self, **fields: Any) -> None:
        import time

        from tensorboardX.proto.event_pb2 import Event

        self._records.write(Event(wall_time=time.time(), **fields).SerializeToString())

    @contextlib.contextmanager
    def _naming_the_file(self) -> Iterator[None]:
        try:
            yield
        except OSError as e:
            self._failed = True
            if e.filename is not None:
                raise
            raise OSError(e.errno, e.strerror, str(self.path)) from None
