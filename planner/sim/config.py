"""Typed, validated configuration of the simulated cluster (docs/design.md §4).

Hydra composes plain mappings from `conf/sim/*.yaml`; `planner.configs.build(SimConfig, mapping,
"sim")` turns them into these frozen dataclasses, once, at the entry point.
Unknown keys are errors: a typo in a sweep must not silently run the default. Defaults live only
in these dataclasses; the YAML files override what differs.

To add a knob: add a field with a default and a comment here, validate it in `__post_init__`, and
read it where it is used (`workers.py`, `trainer.py`, `faults.py`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from planner.configs import build, check
from planner.types import check_sync_mode

SYNC_MODES = ("partial", "drain", "pinned")  # the simulator's part of planner/types.py SYNC_MODES
RESIDENT_VERSIONS = 4  # K under sync_mode=pinned when sim.workers.resident_versions is not given
RECOVERY_MODES = ("resume", "regenerate")
SPECULATION_WHEN = ("never", "critical", "always")  # engine.speculation.when's words and meanings


@dataclass(frozen=True)
class SpeculationSimConfig:
    """`sim.workers.speculation.*`: speculative decoding, modelled in expectation.

    A speculating sequence drafts k = `tokens` tokens, the policy verifies them in one forward
    pass and keeps each with probability a = `acceptance` (i.i.d., the standard analysis of
    Leviathan et al. 2023), plus the one token the verification always yields: it advances by the
    expected accepted run (1 − a^(k+1))/(1 − a) tokens per decode step instead of 1. The model is
    the deterministic expectation — no random draws, so a run is a function of its seed whether
    speculation is on or off. A decode step in which any active sequence speculates costs
    α·(1 + draft_cost·k) + β·active: `draft_cost` is the draft's cost per drafted token as a
    fraction of α (≈ 0 for prompt/n-gram lookup; a draft model's weight reads relative to the
    policy's for a draft model, e.g. 0.1 for a 10× smaller one); the verification's extra KV reads
    are not modelled (k + 1 queries read a sequence's KV once, and a weight-bound step is bound by
    the weights). Only in the weight-bound regime: while the step's query positions — one per active
    sequence plus k more per speculating one — stay within (k + 1)·`max_active`, what `max_active`
    speculating sequences use; beyond it the step is compute-bound and decodes plainly. Under
    when=always every active sequence speculates, so this is "at most `max_active` active", the
    runtime's rule; under when=critical a few marked stragglers still fit in a crowded step where
    speculating everyone would not — which is where the planner's choice pays. `when` has the
    runtime's meanings: never
    | critical (the groups the policy names in `Decision.critical`, from then on) | always (every
    sequence, what any policy can use).

    Attributes:
      when: never | critical (the groups the policy marks) | always (every sequence)
      acceptance: a: probability that one drafted token is accepted (a step then yields
        (1-a^(k+1))/(1-a) tokens)
      tokens: k: tokens drafted per verification
      draft_cost: the draft's cost per drafted token, as a fraction of decode_alpha
      max_active: weight-bound while active + k·speculating <= (k+1)·max_active (all speculating:
        active <= max_active)
    """

    when: str = "never"
    acceptance: float = 0.7
    tokens: int = 4
    draft_cost: float = 0.05
    max_active: int = 32

    def __post_init__(self) -> None:
        p = "sim.workers.speculation"
        check(self.when in SPECULATION_WHEN, f"{p}.when", self.when, f"must be one of {', '.join(SPECULATION_WHEN)}")
        check(0 <= self.acceptance <= 1, f"{p}.acceptance", self.acceptance, "must be in [0, 1]")
        for name in ("tokens", "max_active"):
            value = getattr(self, name)
            check(isinstance(value, int) and not isinstance(value, bool) and value >= 1, f"{p}.{name}", value,
                  "must be an int >= 1")
        check(self.draft_cost >= 0, f"{p}.draft_cost", self.draft_cost, "must be >= 0")

    @property
    def rate(self) -> float:
        """Expected tokens a speculating sequence emits per decode step: (1 − a^(k+1))/(1 − a)."""
        a, k = self.acceptance, self.tokens
        return float(k + 1) if a == 1 else (1 - a ** (k + 1)) / (1 - a)

    @property
    def step_alpha_factor(self) -> float:
        """A speculating step's fixed cost as a multiple of α: 1 + draft_cost·k."""
        return 1 + self.draft_cost * self.tokens


@dataclass(frozen=True)
class WorkerConfig:
    """Generation workers: continuous batching with a memory-bound decode step.

    Attributes:
      num_workers: generation workers (engines)
      speeds: per-worker speed factor (uneven workers); None = all 1
      max_concurrency: sequences decoding at once on one worker (engine slots)
      kv_capacity: KV-cache tokens per worker (prompt + response of running groups)
      decode_alpha: s per decode step, fixed part (weights read once per step)
      decode_beta: s per decode step per active sequence (KV reads)
      prefill_per_token: s per prompt (or resumed prefix) token; stalls that worker's decode
      t_sync: s to load new weights on one worker
      load_lag: s from the trainer's publish of a version until a worker starts loading it
        (conversion, transfer, the engine finishing its iteration): its tokens meanwhile are on the
        old version.
      colocated_slowdown: Engine and trainer share devices (one machine's cores): while the trainer
        runs a step, every decode step costs (1 + colocated_slowdown)× its α + β·active. Applies to
        all workers (on one machine all are colocated); prefill and weight loads are not slowed. 0 =
        separate devices.
      compile_s: s before each worker's first decode step (a real engine compiles its jitted steps
        on the first iteration; planner.calibrate fits it from the trace's compiling iterations). 0
        = none.
      sync_mode: partial: load now, in-flight samples continue | drain: finish in-flight, then load |
        pinned: the update is one more resident version at no swap cost; in-flight samples finish
        on the version they started on, new ones start on the newest (LoRA adapters)
      resident_versions: K, versions one worker holds at once under sync_mode=pinned (the newest
        and those in-flight samples are pinned to); an update that needs a (K+1)-th waits, holding
        new starts, until a pinned version frees. null = 4. Acts only under pinned.
      speculation: speculative decoding (`sim.workers.speculation.*`).
      migration_s: s to move a migrated group's prompt + prefix to its target worker
        (Decision.migrate); the target also re-prefills them (prefill_per_token). Both stall the
        target's decoding.
    """

    num_workers: int = 4
    speeds: tuple[float, ...] | None = None
    max_concurrency: int = 256
    kv_capacity: int = 4_000_000
    decode_alpha: float = 0.03
    decode_beta: float = 1e-4
    prefill_per_token: float = 2e-5
    t_sync: float = 2.0
    load_lag: float = 0.0
    colocated_slowdown: float = 0.0
    compile_s: float = 0.0
    sync_mode: str = "partial"
    resident_versions: int | None = None
    speculation: SpeculationSimConfig = field(default_factory=SpeculationSimConfig)
    migration_s: float = 0.05

    def __post_init__(self) -> None:
        p = "sim.workers"
        check(self.num_workers > 0, f"{p}.num_workers", self.num_workers, "must be a positive integer")
        if self.speeds is not None:
            object.__setattr__(self, "speeds", tuple(float(s) for s in self.speeds))
            if len(self.speeds) != self.num_workers:
                raise ValueError(f"{p}.speeds has {len(self.speeds)} entries: must have num_workers={self.num_workers}")
            for i, s in enumerate(self.speeds):
                check(s > 0, f"{p}.speeds[{i}]", s, "must be > 0")
        for name in ("max_concurrency", "kv_capacity", "decode_alpha"):
            check(getattr(self, name) > 0, f"{p}.{name}", getattr(self, name), "must be > 0")
        for name in ("decode_beta", "prefill_per_token", "t_sync", "load_lag", "colocated_slowdown", "compile_s",
                     "migration_s"):
            check(getattr(self, name) >= 0, f"{p}.{name}", getattr(self, name), "must be >= 0")
        check_sync_mode(f"{p}.sync_mode", self.sync_mode, SYNC_MODES)
        k = self.resident_versions
        check(k is None or (isinstance(k, int) and not isinstance(k, bool) and k >= 1), f"{p}.resident_versions", k,
              "must be an int >= 1 (versions a worker holds at once), or null for 4")

    @property
    def resident(self) -> int:
        """K: versions one worker holds at once under sync_mode=pinned."""
        return RESIDENT_VERSIONS if self.resident_versions is None else self.resident_versions

    def idle_keys(self) -> list[str]:
        """A one-line warning for each `sim.workers.*` key given that cannot act in this configuration."""
        if self.resident_versions is not None and self.sync_mode != "pinned":
            return [f"sim.workers.resident_versions={self.resident_versions}: has no effect with "
                    f"sim.workers.sync_mode={self.sync_mode} (only pinned keeps several versions resident)"]
        return []

    def speed(self, index: int) -> float:
        return 1.0 if self.speeds is None else self.speeds[index]


@dataclass(frozen=True)
class SimTrainerConfig:
    """One optimizer step costs `c0 + c1 · tokens_in_batch` (prompt + response tokens).

    Attributes:
      c0: s: fixed cost (optimizer update, publish)
      c1: s per token in the batch
      wait_sync: true: the next step starts only once every live worker holds the version the last
        one published (the runtime pushes weights before it selects the next batch); false: the
        trainer goes on while the workers load.
      compile_s: s added to the first step (a real trainer compiles its jitted update on the first
        step; planner.calibrate fits it from the steps it leaves out of the c0/c1 fit). 0 = none.
    """

    c0: float = 5.0
    c1: float = 1.5e-4
    wait_sync: bool = False
    compile_s: float = 0.0

    def __post_init__(self) -> None:
        check(isinstance(self.wait_sync, bool), "sim.trainer.wait_sync", self.wait_sync, "must be true or false")
        for name in ("c0", "c1", "compile_s"):
            check(getattr(self, name) >= 0, f"sim.trainer.{name}", getattr(self, name), "must be >= 0")
        if self.c0 + self.c1 <= 0:
            raise ValueError("sim.trainer: c0 + c1 must be > 0 (a free trainer step never advances time)")


@dataclass(frozen=True)
class FaultSpec:
    """Worker `worker` dies at simulated time `time`."""

    time: float
    worker: int


@dataclass(frozen=True)
class FaultConfig:
    """Worker faults: a fixed list, a Poisson rate, or both; and attempts that hang (stalls).

    Attributes:
      events: [{time, worker}, ...]
      rate: faults per worker per simulated hour (exponential gaps, own seeded stream)
      recovery: resume: keep generated tokens | regenerate: start over (tokens wasted)
      restart_after: s until a dead worker comes back; None = never
      stall_prob: Each attempt hangs with this probability: it starts, holds its slots and KV, and
        never streams a token (a request stuck in an engine), until the stall timeout aborts it.
      stall_timeout_s: The runtime's rollout.stall_timeout_s: a hung attempt is aborted this long
        after its start and regenerated through on_group_lost(prefix_kept=False); None = no
        watchdog.
    """

    events: tuple[FaultSpec, ...] = ()
    rate: float = 0.0
    recovery: str = "resume"
    restart_after: float | None = None
    stall_prob: float = 0.0
    stall_timeout_s: float | None = 300.0

    def __post_init__(self) -> None:
        p = "sim.faults"
        events = []
        for i, e in enumerate(self.events):
            e = e if isinstance(e, FaultSpec) else build(FaultSpec, e, f"{p}.events[{i}]")
            check(e.time >= 0, f"{p}.events[{i}].time", e.time, "must be >= 0")
            events.append(e)
        object.__setattr__(self, "events", tuple(events))
        check(self.rate >= 0, f"{p}.rate", self.rate, "must be >= 0")
        check(self.recovery in RECOVERY_MODES, f"{p}.recovery", self.recovery,
              f"must be one of {', '.join(RECOVERY_MODES)}")
        check(self.restart_after is None or self.restart_after >= 0, f"{p}.restart_after", self.restart_after,
              "must be >= 0, or null for never")
        check(0 <= self.stall_prob < 1, f"{p}.stall_prob", self.stall_prob, "must be in [0, 1)")
        check(self.stall_timeout_s is None or self.stall_timeout_s > 0, f"{p}.stall_timeout_s", self.stall_timeout_s,
              "must be > 0, or null for no stall watchdog")
        check(self.stall_prob == 0 or self.stall_timeout_s is not None, f"{p}.stall_timeout_s", self.stall_timeout_s,
              f"must be set when {p}.stall_prob > 0: without a watchdog a hung attempt holds its batch forever")


@dataclass(frozen=True)
class SimConfig:
    """Everything about the simulated cluster; the policy and workload are configured apart.

    Attributes:
      workers: the generation workers (`sim.workers.*`).
      trainer: the trainer's step cost (`sim.trainer.*`).
      faults: worker faults and stalls (`sim.faults.*`).
      admission_window: candidates shown to policy.admit; None = 2·batch_groups
    """

    workers: WorkerConfig = field(default_factory=WorkerConfig)
    trainer: SimTrainerConfig = field(default_factory=SimTrainerConfig)
    faults: FaultConfig = field(default_factory=FaultConfig)
    admission_window: int | None = None

    def __post_init__(self) -> None:
        window = self.admission_window
        check(window is None or (isinstance(window, int) and window >= 1), "sim.admission_window", window,
              "must be an int >= 1, or null for the default 2·batch_groups (0 is not the default: use null)")
        for e in self.faults.events:
            check(0 <= e.worker < self.workers.num_workers, "sim.faults.events worker", e.worker,
                  f"no such worker (num_workers={self.workers.num_workers})")
