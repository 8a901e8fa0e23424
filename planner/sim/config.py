"""Typed, validated configuration of the simulated cluster (DESIGN §4).

Hydra composes plain mappings from `conf/sim/*.yaml`; `SimConfig.from_mapping` turns them into
frozen dataclasses here, once, at the entry point (STYLE brief 3). Unknown keys are errors: a typo
in a sweep must not silently run the default. Defaults live only in these dataclasses; the YAML
files override what differs.

To add a knob: add a field with a default and a comment here, validate it in `__post_init__`, and
read it where it is used (`workers.py`, `trainer.py`, `faults.py`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

T = TypeVar("T")

SYNC_MODES = ("drain", "inflight")
RECOVERY_MODES = ("resume", "regenerate")


def build(cls: type[T], values: Mapping[str, Any] | None, prefix: str) -> T:
    """`cls(**values)` that names the unknown key (with its full dotted path) instead of a TypeError."""
    values = dict(values or {})
    known = {f.name for f in dataclasses.fields(cls)}
    for key in values:
        if key not in known:
            raise ValueError(f"{prefix}.{key}: unknown key (known: {', '.join(sorted(known))})")
    return cls(**values)


def _positive(prefix: str, name: str, value: float, *, allow_zero: bool = False) -> None:
    ok = value >= 0 if allow_zero else value > 0
    if not ok:
        rule = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"{prefix}.{name}={value}: must be {rule}")


@dataclass(frozen=True)
class WorkerConfig:
    """Generation workers: continuous batching with a memory-bound decode step."""

    num_workers: int = 4
    speeds: tuple[float, ...] | None = None  # per-worker speed factor (uneven workers); None = all 1
    max_concurrency: int = 256  # sequences decoding at once on one worker (engine slots)
    kv_capacity: int = 4_000_000  # KV-cache tokens per worker (prompt + response of running groups)
    decode_alpha: float = 0.03  # s per decode step, fixed part (weights read once per step)
    decode_beta: float = 1e-4  # s per decode step per active sequence (KV reads)
    prefill_per_token: float = 2e-5  # s per prompt (or resumed prefix) token; stalls that worker's decode
    t_sync: float = 2.0  # s to load new weights on one worker
    sync_mode: str = "inflight"  # drain: finish in-flight, then load | inflight: pause, partial rollout

    def __post_init__(self) -> None:
        p = "sim.workers"
        if self.num_workers <= 0:
            raise ValueError(f"{p}.num_workers={self.num_workers}: must be a positive integer")
        if self.speeds is not None:
            object.__setattr__(self, "speeds", tuple(float(s) for s in self.speeds))
            if len(self.speeds) != self.num_workers:
                raise ValueError(f"{p}.speeds has {len(self.speeds)} entries: must have num_workers={self.num_workers}")
            for s in self.speeds:
                _positive(p, "speeds[]", s)
        _positive(p, "max_concurrency", self.max_concurrency)
        _positive(p, "kv_capacity", self.kv_capacity)
        _positive(p, "decode_alpha", self.decode_alpha)
        _positive(p, "decode_beta", self.decode_beta, allow_zero=True)
        _positive(p, "prefill_per_token", self.prefill_per_token, allow_zero=True)
        _positive(p, "t_sync", self.t_sync, allow_zero=True)
        if self.sync_mode not in SYNC_MODES:
            raise ValueError(f"{p}.sync_mode={self.sync_mode!r}: must be one of {', '.join(SYNC_MODES)}")

    def speed(self, index: int) -> float:
        return 1.0 if self.speeds is None else self.speeds[index]


@dataclass(frozen=True)
class TrainerConfig:
    """One optimizer step costs `c0 + c1 · tokens_in_batch` (prompt + response tokens)."""

    c0: float = 5.0  # s: fixed cost (optimizer update, publish)
    c1: float = 1.5e-4  # s per token in the batch

    def __post_init__(self) -> None:
        _positive("sim.trainer", "c0", self.c0, allow_zero=True)
        _positive("sim.trainer", "c1", self.c1, allow_zero=True)
        if self.c0 + self.c1 <= 0:
            raise ValueError("sim.trainer: c0 + c1 must be > 0 (a free trainer step never advances time)")


@dataclass(frozen=True)
class FaultSpec:
    """Worker `worker` dies at simulated time `time`."""

    time: float
    worker: int


@dataclass(frozen=True)
class FaultConfig:
    """Worker faults: a fixed list, a Poisson rate, or both."""

    events: tuple[FaultSpec, ...] = ()  # [{time, worker}, ...]
    rate: float = 0.0  # faults per worker per simulated hour (exponential gaps, own seeded stream)
    recovery: str = "resume"  # resume: keep generated tokens | regenerate: start over (tokens wasted)
    restart_after: float | None = None  # s until a dead worker comes back; None = never

    def __post_init__(self) -> None:
        p = "sim.faults"
        events = []
        for i, e in enumerate(self.events):
            e = e if isinstance(e, FaultSpec) else build(FaultSpec, e, f"{p}.events[{i}]")
            if e.time < 0:
                raise ValueError(f"{p}.events[{i}].time={e.time}: must be >= 0")
            events.append(e)
        object.__setattr__(self, "events", tuple(events))
        _positive(p, "rate", self.rate, allow_zero=True)
        if self.recovery not in RECOVERY_MODES:
            raise ValueError(f"{p}.recovery={self.recovery!r}: must be one of {', '.join(RECOVERY_MODES)}")
        if self.restart_after is not None:
            _positive(p, "restart_after", self.restart_after, allow_zero=True)


@dataclass(frozen=True)
class SimConfig:
    """Everything about the simulated cluster; the policy and workload are configured apart."""

    workers: WorkerConfig = field(default_factory=WorkerConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    faults: FaultConfig = field(default_factory=FaultConfig)
    admission_window: int | None = None  # candidates shown to policy.admit; None = 2·batch_groups

    def __post_init__(self) -> None:
        if self.admission_window is not None and self.admission_window <= 0:
            raise ValueError(f"sim.admission_window={self.admission_window}: must be positive or null")
        for e in self.faults.events:
            if not 0 <= e.worker < self.workers.num_workers:
                raise ValueError(
                    f"sim.faults.events worker={e.worker}: no such worker (num_workers={self.workers.num_workers})"
                )

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any] | None) -> SimConfig:
        values = dict(values or {})
        known = {f.name for f in dataclasses.fields(cls)}
        for key in values:
            if key not in known:
                raise ValueError(f"sim.{key}: unknown key (known: {', '.join(sorted(known))})")
        return cls(
            workers=build(WorkerConfig, values.get("workers"), "sim.workers"),
            trainer=build(TrainerConfig, values.get("trainer"), "sim.trainer"),
            faults=build(FaultConfig, values.get("faults"), "sim.faults"),
            admission_window=values.get("admission_window"),
        )
