"""The controller's part of a checkpoint: a JSON object next to the trainer's arrays.

It holds what the run needs to continue as if it had not stopped (DESIGN §2: no group lost,
none trained twice, the bound kept across the restart):

- `step`, `version` (what the engine held), `next_uid` (uids stay unique across segments);
- the planner's `policy.state_dict()` and the data stream's position;
- the candidate window (prompts drawn from the stream but not admitted yet);
- every admitted, untrained group with its prompt, its phase and — for done groups — its
  completed samples and rewards. Groups still generating (or being scored) are regenerated on
  resume through the planner's fault path, `on_group_lost(prefix_kept=False)`;
- the run statistics so far, and the byte lengths of `ledger.jsonl` / `metrics.jsonl`, which a
  resume cuts back to (`checkpoint.truncate`) so that no event after the save is counted twice;
- `run`: the settings a resume must match (policy, B, n, η, seed), checked by the entry point.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Any

from jaxrl_async.runtime.metrics import METRICS_FILE, RunStats
from jaxrl_async.runtime.rollouts import GroupRollout
from jaxrl_async.tasks.base import Prompt
from planner.ledger import LEDGER_FILE
from planner.types import Candidate

if TYPE_CHECKING:
    from jaxrl_async.runtime.controller import Controller


def controller_state(ctrl: Controller, stats: RunStats) -> dict[str, Any]:
    """The JSON state of `ctrl` at a step boundary (`stats`: the totals up to now)."""
    return {
        "run": ctrl.run_config_meta,
        "step": ctrl.step,
        "version": ctrl.version,
        "next_uid": ctrl.next_uid,
        "policy": ctrl.policy.state_dict(),
        "stream": ctrl.stream.state_dict(),
        "window": [[c.uid, dataclasses.asdict(p)] for c, p in ctrl.window],
        "groups": [{"prompt": dataclasses.asdict(g.prompt), "phase": g.phase, "rollout": g.rollout.to_json()}
                   for g in ctrl.groups.values()],
        "stats": stats.to_json(),
        "ledger_bytes": _size(ctrl.run_dir / LEDGER_FILE),
        "metrics_bytes": _size(ctrl.run_dir / METRICS_FILE),
    }


def restore_controller(ctrl: Controller, meta: dict[str, Any]) -> list[int]:
    """Load `meta` into `ctrl` (and its policy and stream); returns the uids to regenerate."""
    from jaxrl_async.runtime.controller import DONE, GENERATING, LiveGroup

    ctrl.step, ctrl.version, ctrl.next_uid = meta["step"], meta["version"], meta["next_uid"]
    ctrl.policy.load_state_dict(meta["policy"])
    ctrl.stream.load_state_dict(meta["stream"])
    ctrl.window = [(Candidate(uid, p["prompt_id"], len(p["prompt_ids"])), Prompt(**p)) for uid, p in meta["window"]]
    ctrl.stats = RunStats.from_json(meta["stats"])
    ctrl.groups = {}
    lost = []
    for g in meta["groups"]:
        rollout = GroupRollout.from_json(g["rollout"])
        live = LiveGroup(Prompt(**g["prompt"]), rollout, g["phase"])
        ctrl.groups[rollout.uid] = live
        if live.phase != DONE:
            live.phase = GENERATING  # its engine is gone: regenerated from scratch
            lost.append(rollout.uid)
    return lost


def _size(path: Path) -> int:
    return path.stat().st_size if path.exists() else 0
