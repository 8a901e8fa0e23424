"""Records exchanged between a staleness policy and the driver that runs it.

A *driver* is whatever advances time: the discrete-event simulator (`planner.sim`) or the real
runtime (`jaxrl_async.runtime`). It reports events to the policy (`planner.base.Policy`) and
applies the `Decision` each call returns. Nothing here reads a clock: `now` is always passed in.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from planner.configs import check


@dataclass(frozen=True, slots=True)
class PlanContext:
    """What every policy knows about the run before it starts (docs/design.md §1)."""

    batch_groups: int  # B: groups per optimizer step
    group_size: int  # n: trajectories per group
    max_staleness: int | None  # η; None = unbounded (the async ceiling reference)
    total_steps: int  # S: the run trains steps 0 .. S-1

    def __post_init__(self) -> None:
        check(self.batch_groups > 0, "batch_groups", self.batch_groups, "must be a positive integer")
        check(self.group_size > 0, "group_size", self.group_size, "must be a positive integer")
        check(self.max_staleness is None or self.max_staleness >= 0, "max_staleness", self.max_staleness,
              "must be >= 0 (or null for unbounded)")
        check(self.total_steps > 0, "steps", self.total_steps, "must be a positive integer")


@dataclass(frozen=True, slots=True)
class Candidate:
    """A prompt the driver could admit now, in data-stream order."""

    uid: int
    prompt_id: int | str
    prompt_tokens: int = 0
    # The true longest response of the group, known only to a simulator; the oracle
    # predictor reads it, every other component must ignore it.
    oracle_tokens: int | None = None


@dataclass(frozen=True, slots=True)
class Admission:
    """The policy lets group `uid` start generating.

    `version` is the admission version a(g): a lower bound on the generation version of every
    token the group will get. The driver must not start (or resume) the group on weights older
    than `version` — for a fresh admission every live worker qualifies (`version` is the synced
    version); a re-admission after a fault may carry a later one (a start barrier), which the
    driver honours by routing to, or waiting for, a worker that holds it. `priority` goes to the
    engine; lower is served first.
    """

    uid: int
    prompt_id: int | str
    version: int
    deadline: int | None = None
    priority: float = 0.0
    planned_step: int | None = None


@dataclass(frozen=True, slots=True)
class Drop:
    """Group `uid` is thrown away at trainer step `step`; a running group is aborted first."""

    uid: int
    step: int
    reason: str


@dataclass(frozen=True, slots=True)
class Move:
    """The planner re-planned group `uid` from step `src` to step `dst` (ledger `move`)."""

    uid: int
    src: int
    dst: int


@dataclass(slots=True)
class Decision:
    """Everything a policy asks the driver to do after one event.

    `train` is only set by `select_batch`: the uids of batch `step`, or None to wait for the
    next event. Every driver applies a decision with `planner.driver.apply_decision`: `moves`
    (to the ledger), `drop`, `critical`, `migrate`, `train`, then `admit` in list order
    (docs/design.md §8.6).

    `critical` and `migrate` schedule the tail's generation (docs/design.md §2.14); neither
    changes a token's version, so neither can break a bound:
    - `critical`: running groups the trainer waits for; an engine with
      `speculation.when=critical` speculates their decoding from now on.
    - `migrate`: running groups to move, generated prefix kept, to a less loaded engine replica
      (the driver picks it; with one replica, or none less loaded, nothing moves). Each move
      that happens is a ledger `migrate` line.
    """

    admit: list[Admission] = field(default_factory=list)
    drop: list[Drop] = field(default_factory=list)
    moves: list[Move] = field(default_factory=list)
    train: list[int] | None = None
    critical: list[int] = field(default_factory=list)
    migrate: list[int] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.admit or self.drop or self.moves or self.train is not None or self.critical
                    or self.migrate)


class GroupState(enum.IntEnum):
    """The life of a group: one vocabulary for the policies' records (`planner.base.Group.status`),
    the simulator's groups (`planner.sim.group.SimGroup.state`) and what a driver holds of a uid
    (`planner.driver.DecisionHost.held`; None there: nothing, never offered or already closed).

        CANDIDATE -> QUEUED -> RUNNING -> DONE -> TRAINED
                       LOST (its worker died) -> QUEUED again on re-admission
        any admitted state but TRAINED -> DROPPED

    Each component uses the states it sees: a policy never holds a CANDIDATE, and a lost group is
    QUEUED again in its table (awaiting the re-admission); a driver forgets a group once trained or
    dropped. The numbers are what a policy's `state_dict` writes: QUEUED..DROPPED keep them so
    saved checkpoints load; comparisons read only `state <= RUNNING` (in flight).
    """

    QUEUED = 0  # admitted, waiting for an engine slot (a worker's queue, or parked: no worker alive)
    RUNNING = 1  # generating (in the runtime: or being scored)
    DONE = 2  # generated (and scored): may be trained
    TRAINED = 3
    DROPPED = 4
    LOST = 5  # its worker died; it waits for a re-admission or a drop
    CANDIDATE = 6  # offered to `admit`, not admitted


# (version, tokens) pairs: a group's token counts by generation version.
Versions = list[tuple[int, int]]


# How a generation worker takes new weights: one vocabulary for the simulator
# (`sim.workers.sync_mode`), the JAX engine and vLLM (`engine.sync_mode`); docs/design.md §5.3.
#   partial   in-flight samples continue on the new weights (partial rollout)
#   drain     in-flight samples finish on the old weights, then the weights swap
#   resubmit  vLLM only: abort in flight, push, resubmit each sample as prompt + its tokens so far
#   pinned    the update becomes one more resident version (LoRA adapters, `engine.adapter_versions`):
#             in-flight samples finish on the version they were admitted on, new ones start on the
#             newest, nothing waits and no sequence mixes versions
SYNC_MODES = ("partial", "drain", "resubmit", "pinned")
RENAMED_SYNC_MODES = {"inflight": "partial", "keep": "partial"}  # the simulator's and vLLM's old words


def check_sync_mode(key: str, value: str, supported: tuple[str, ...]) -> None:
    """`value` is one of `supported` (a backend's part of SYNC_MODES); an old word names its new one."""
    if value in RENAMED_SYNC_MODES:
        raise ValueError(f"{key}={value!r} is now {RENAMED_SYNC_MODES[value]!r}")
    check(value in supported, key, value, f"must be one of {', '.join(supported)}")
