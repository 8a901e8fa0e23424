"""Whether a run continues an earlier one, and whether the earlier one is compatible with it.

`resume=true` continues the run in `hydra.run.dir`, `resume=PATH` the run in PATH
(docs/fault_tolerance.md). What each case does:

- `resume=PATH` where PATH holds no run (no run file, no lock): a one-line error before anything
  is created — a typo must not train a fresh run somewhere new and exit 0.
- a run with a checkpoint: continue from its newest one that is whole; `check_compatible` compares
  the saved settings (`run_meta`) with today's, refusing what would make the saved state
  meaningless and warning about the rest, and `restore` loads the trainer state and cuts the logs
  back to it. A checkpoint that fails its manifest or its restore (`CheckpointDamaged`) is one
  warning line and the next older one is tried; the damaged ones are set aside as `N.damaged`
  (so the resumed run saves step N afresh); none whole is one error line naming each. Nothing is
  loaded until one checkpoint has restored whole: never params of one step with the state of another.
- a run whose checkpoint is at `steps` (killed after its final save, before its export and
  summary): `finished` is true, and the job writes them without training (job/lifecycle.py).
- a run without a checkpoint (killed before its first save): start afresh, its files set aside
  in `RUN_DIR/attempts/N/` (jaxrl_async/run_dir.py), with a warning naming them.
- `resume=true` on a directory with no run yet: start a fresh run there, and say so.
- no `resume` on a directory that holds a ledger: refused, so a run is never overwritten.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from jaxrl_async.runtime.samples import SAMPLES_FILE
from jaxrl_async.checkpoint import CHECKPOINT_DIR, CheckpointDamaged, Checkpointer, TreeMismatch, truncate
from jaxrl_async.job.setup import TrainSetup
from jaxrl_async.run_dir import LOCK_FILE, RUN_FILES, set_aside
from jaxrl_async.runtime.metrics import METRICS_FILE
from jaxrl_async.tasks.base import Task
from jaxrl_async.trainer.config import LoraConfig
from jaxrl_async.trainer.trainer import Trainer
from planner.ledger import LEDGER_FILE
from planner.run_trace import TRACE_FILE

log = logging.getLogger(__name__)

# What a resume compares with the checkpoint (docs/fault_tolerance.md, "What a resume checks").
# Refused: the planner's context and the data — the saved policy state, stream position and
# untrained groups mean nothing under another B, n, η, seed, policy or dataset.
REFUSED_CHANGES = ("policy", "batch_groups", "group_size", "max_staleness", "seed", "task_data", "steps",
                   "trainer.lora")
# Warned: a run may go on with another learning rate or sampling setting, or from a moved model
# directory (a model that does not fit the checkpoint's arrays fails when they are restored).
WARNED_CHANGES = ("model.source", "trainer.optim.lr", "temperature", "top_p", "max_new_tokens", "task")


def run_dir_for(setup: TrainSetup, hydra_dir: str | Path) -> Path:
    """The run's directory: `resume=PATH`'s PATH, else Hydra's `hydra.run.dir`."""
    resume = setup.run.resume
    return Path(resume) if isinstance(resume, str) else Path(hydra_dir)


def holds_run(run_dir: Path) -> bool:
    """Whether `run_dir` holds (what is left of) a run: any run file, or the lock of one that started."""
    return any((run_dir / name).exists() for name in (*RUN_FILES, LOCK_FILE))


def check_resume_target(run_dir: Path, resume: bool | str | None) -> None:
    """Refuse `resume=PATH` when PATH holds no run; called before anything is written."""
    if isinstance(resume, str) and not holds_run(run_dir):
        what = "holds no run" if run_dir.is_dir() else "does not exist"
        raise ValueError(f"resume={resume}: {what} (no ledger.jsonl, checkpoints/ or run.lock); pass the "
                         "directory of an earlier run, or drop resume= to start a fresh one")


def start_resuming(run_dir: Path, resume: bool | str | None, *, leader: bool) -> bool:
    """Whether this run continues from `run_dir`'s newest checkpoint (every process decides alike);
    the leader sets a checkpoint-less run's files aside. Called with the run directory locked."""
    if not resume:
        if leader and (run_dir / LEDGER_FILE).exists():
            raise ValueError(f"hydra.run.dir={run_dir}: already holds a run; pass resume=true to continue it "
                             "(or to start it afresh if it never saved a checkpoint) or choose another hydra.run.dir")
        return False
    # Looked at before the checkpointer is opened: opening it creates an empty checkpoints/.
    had_run = any((run_dir / name).exists() for name in RUN_FILES)
    if had_run and Checkpointer(run_dir).latest_step() is not None:
        return True
    if not leader:
        return False
    where = set_aside(run_dir) if had_run else None
    if where is None:
        log.warning("resume: %s holds no run yet; starting a fresh run there", run_dir)
    else:
        # Killed before its first save: nothing to continue.
        log.warning("resume: no checkpoint in %s (the run stopped before its first save); starting afresh, "
                    "the earlier attempt's files are in %s", run_dir / "checkpoints", where)
    return False


def restore(checkpointer: Checkpointer, trainer: Trainer, setup: TrainSetup, task: Task, run_dir: Path, *,
            leader: bool) -> dict[str, Any]:
    """Check the newest whole checkpoint against today's settings, load every process's shards of
    the trainer state, and (the leader) cut the logs back to it; returns the checkpoint's meta.
    Damaged checkpoints newer than it are warned about in one line each and set aside."""
    now = run_meta(setup, task)
    damaged: list[CheckpointDamaged] = []
    for step in checkpointer.all_steps():
        try:
            found = checkpointer.damage(step)
            if found is not None:
                raise CheckpointDamaged(step, found)
            changes = check_compatible(checkpointer.read_meta(step), now)
            trainer_state, meta = checkpointer.restore(trainer.state_dict(), step)
        except CheckpointDamaged as e:
            damaged.append(e)
            continue
        except TreeMismatch as e:
            raise ValueError(f"resume: model.source={setup.model.source!r} does not fit the checkpoint: {e}; "
                             "resume with the checkpointed run's model") from None
        break
    else:
        what = "; ".join(str(e) for e in damaged) if damaged else f"no checkpoint in {checkpointer.directory}"
        raise ValueError(f"resume: {what}; no checkpoint restores (start afresh in another hydra.run.dir)")
    # Only now, with one checkpoint read whole, is anything loaded or cut back.
    trainer.load_state_dict(trainer_state)
    if leader:
        for e in damaged:
            log.warning("%s; resuming from %s/%d", e, CHECKPOINT_DIR, step)
            checkpointer.set_aside(e.step)
        if changes:
            log.warning("resume: settings changed since the checkpoint: %s", "; ".join(changes))
        truncate(run_dir / LEDGER_FILE, meta["ledger_bytes"])
        truncate(run_dir / METRICS_FILE, meta["metrics_bytes"])
        if meta.get("trace_bytes") is not None:  # older checkpoints: no trace
            truncate(run_dir / TRACE_FILE, meta["trace_bytes"])
        if meta.get("samples_bytes") is not None and (run_dir / SAMPLES_FILE).exists():
            truncate(run_dir / SAMPLES_FILE, meta["samples_bytes"])
    return meta


def finished(meta: Mapping[str, Any], steps: int) -> bool:
    """Whether the restored checkpoint is the run's final one (all `steps` trained): the run was
    killed after its final save, and only its export and summary are left to do."""
    return meta["step"] >= steps


def run_meta(setup: TrainSetup, task: Task) -> dict[str, Any]:
    """What a resume compares (`REFUSED_CHANGES`, `WARNED_CHANGES`); saved in every checkpoint."""
    run = setup.run
    return {"policy": setup.policy_name, "batch_groups": run.batch_groups, "group_size": run.group_size,
            "max_staleness": run.max_staleness, "seed": run.seed, "steps": run.steps,
            "task_data": task_fingerprint(task), "model.source": setup.model.source,
            "trainer.optim.lr": setup.trainer.optim.lr, "temperature": run.temperature, "top_p": run.top_p,
            "max_new_tokens": run.max_new_tokens, "task": dict(setup.task),
            # Only with LoRA, so that a full fine-tuning run's meta is what it always was.
            **({"trainer.lora": lora_meta(setup.trainer.lora)} if setup.trainer.lora.enabled else {})}


def lora_meta(lora: LoraConfig) -> dict[str, Any]:
    """The adapter's shape and scale: a checkpoint's adapter means nothing under others."""
    return {"rank": lora.rank, "alpha": lora.alpha, "targets": list(lora.targets)}


def task_fingerprint(task: Task) -> str:
    """A hash of the task's examples (ids, contents, answers): equal iff the data is the same."""
    digest = hashlib.sha256()
    for e in task.examples():
        digest.update(json.dumps([e.prompt_id, e.content, e.answer], sort_keys=True, default=str).encode())
    return digest.hexdigest()[:16]


def check_compatible(meta: Mapping[str, Any], now: Mapping[str, Any]) -> list[str]:
    """Raise a one-line ValueError for the first refused change; return the warned ones as
    "key: saved -> now". Keys an older checkpoint lacks are not compared."""
    saved = meta["run"]
    for key in REFUSED_CHANGES:
        if key == "steps":
            # Equal: killed after its final save; the resume only exports and reports (`finished`).
            if meta["step"] > now["steps"]:
                raise ValueError(f"resume: steps={now['steps']} but the checkpointed run has trained {meta['step']} "
                                 f"steps; pass steps={meta['step']} to finish it or a larger steps= to train on")
        elif key in saved and saved[key] != now.get(key):
            what = "the task's data (task.*) differs from" if key == "task_data" else f"{key}={now.get(key)!r} but"
            had = "the checkpointed run's" if key == "task_data" else f"the checkpointed run has {key}={saved[key]!r}"
            raise ValueError(f"resume: {what} {had}; resume with the same setting")
    return [f"{key}: {saved[key]!r} -> {now[key]!r}" for key in WARNED_CHANGES
            if key in saved and saved[key] != now[key]]
