"""The controller's part of a checkpoint: `ControllerSnapshot`, and its JSON object next to the
trainer's arrays.

The controller produces a snapshot (`Controller.snapshot`) and continues from one
(`Controller.restore`); this module only converts a snapshot to and from the checkpoint's JSON
(`to_json` / `from_json`), whose format old checkpoints share. A snapshot holds what the run needs
to continue as if it had not stopped (docs/design.md §2: no group lost, none trained twice, the bound
kept across the restart):

- `step`, `version` (what the engine held), `next_uid` (uids stay unique across segments);
- the planner's `policy.state_dict()` and the data stream's position;
- the candidate window (prompts drawn from the stream but not admitted yet);
- every admitted, untrained group with its prompt, its phase and — for done groups — its
  completed samples and rewards. Groups still generating (or being scored) are regenerated on
  resume through the planner's fault path, `on_group_lost(prefix_kept=False)`;
- the run statistics so far, and the byte lengths of `ledger.jsonl` / `metrics.jsonl` /
  `trace.jsonl` (an older checkpoint has no trace length: nothing to cut), which a
  resume cuts back to (`checkpoint.truncate`) so that no event after the save is counted twice;
- `run`: the settings a resume must match (policy, B, n, η, seed), checked by the entry point.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jaxrl_async.runtime.metrics import METRICS_FILE, RunStats
from jaxrl_async.runtime.rollouts import GroupRollout
from jaxrl_async.runtime.samples import SAMPLES_FILE
from jaxrl_async.tasks.base import Prompt
from planner.ledger import LEDGER_FILE
from planner.run_trace import TRACE_FILE


@dataclass(frozen=True)
class SavedGroup:
    """An admitted, untrained group at the save."""

    prompt: Prompt
    phase: str  # the phase name of runtime/groups.py `LiveGroup.phase_name`: generating, scoring or done
    rollout: GroupRollout  # its samples (complete for a done group) and rewards


@dataclass(frozen=True)
class ControllerSnapshot:
    """The controller at a step boundary; it shares nothing the running controller changes."""

    run: dict[str, Any]  # the settings a resume must match (policy, B, n, η, seed)
    step: int  # the next step to train
    version: int  # the newest version the engine held
    next_uid: int
    policy: dict[str, Any]  # policy.state_dict()
    stream: dict[str, Any]  # the data stream's state_dict()
    window: tuple[tuple[int, Prompt], ...]  # the candidates (uid, prompt), stream order
    groups: tuple[SavedGroup, ...]
    stats: RunStats  # the run's totals up to the save
    ledger_bytes: int  # ledger.jsonl's length at the save: a resume cuts it back to this
    metrics_bytes: int  # metrics.jsonl's, likewise
    trace_bytes: int | None = None  # trace.jsonl's, likewise (None: the run writes no trace)
    samples_bytes: int | None = None  # samples.jsonl's, likewise (None: a checkpoint from before the file)


def file_lengths(run_dir: Path, *, traced: bool) -> dict[str, int | None]:
    """The snapshot's byte lengths of the run's files now (`traced`: the run writes a trace)."""
    def size(name: str) -> int:
        return (run_dir / name).stat().st_size if (run_dir / name).exists() else 0

    return {"ledger_bytes": size(LEDGER_FILE), "metrics_bytes": size(METRICS_FILE),
            "trace_bytes": size(TRACE_FILE) if traced else None,
            "samples_bytes": size(SAMPLES_FILE)}


def to_json(snap: ControllerSnapshot) -> dict[str, Any]:
    """The checkpoint's JSON object of `snap`."""
    return {
        "run": snap.run,
        "step": snap.step,
        "version": snap.version,
        "next_uid": snap.next_uid,
        "policy": snap.policy,
        "stream": snap.stream,
        "window": [[uid, dataclasses.asdict(p)] for uid, p in snap.window],
        "groups": [{"prompt": dataclasses.asdict(g.prompt), "phase": g.phase, "rollout": g.rollout.to_json()}
                   for g in snap.groups],
        "stats": snap.stats.to_json(),
        "ledger_bytes": snap.ledger_bytes,
        "metrics_bytes": snap.metrics_bytes,
        "trace_bytes": snap.trace_bytes,
        "samples_bytes": snap.samples_bytes,
    }


def from_json(meta: dict[str, Any]) -> ControllerSnapshot:
    """The snapshot a checkpoint's JSON object holds (keys it does not know are ignored)."""
    return ControllerSnapshot(
        run=meta["run"], step=meta["step"], version=meta["version"], next_uid=meta["next_uid"],
        policy=meta["policy"], stream=meta["stream"],
        window=tuple((uid, Prompt(**p)) for uid, p in meta["window"]),
        groups=tuple(SavedGroup(Prompt(**g["prompt"]), g["phase"], GroupRollout.from_json(g["rollout"]))
                     for g in meta["groups"]),
        stats=RunStats.from_json(meta["stats"]),
        ledger_bytes=meta["ledger_bytes"], metrics_bytes=meta["metrics_bytes"], trace_bytes=meta.get("trace_bytes"),
        samples_bytes=meta.get("samples_bytes"))
