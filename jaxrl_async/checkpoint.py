"""Checkpoints of a training run: orbax `CheckpointManager` under `run_dir/checkpoints/`.

One checkpoint, taken at a step boundary (after the step's weights are published and synced),
holds two items:

- `trainer`: the pytree of arrays — float32 params and optimizer state (`Trainer.state_dict()`
  without its `version` int, which goes into `meta`);
- `meta`: one JSON object — step, trainer version, the planner's `policy.state_dict()`, the data
  stream position, the controller state (uid counter, the candidate window, every untrained
  group with its completed samples) and the byte lengths of `ledger.jsonl` and `metrics.jsonl`
  at the save, so that a resume truncates lines written after it and no event is counted twice.

Saves are asynchronous (orbax writes in the background after copying the arrays to host memory),
the newest `keep` are kept, and `wait()` blocks until the last one is on disk. Nothing random
needs saving besides the seed: the runtime derives every sampling seed from (seed, uid, attempt).

Restoring checks the arrays against the current trainer's tree (`Trainer.load_state_dict`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orbax.checkpoint as ocp

CHECKPOINT_DIR = "checkpoints"


class Checkpointer:
    def __init__(self, run_dir: str | Path, *, keep: int = 2, every: int = 0) -> None:
        if keep < 1:
            raise ValueError(f"keep_checkpoints={keep}: must be >= 1")
        if every < 0:
            raise ValueError(f"checkpoint_every={every}: must be >= 0 (0 = only on stop and at the end)")
        self.directory = Path(run_dir).absolute() / CHECKPOINT_DIR
        self.every = every
        options = ocp.CheckpointManagerOptions(max_to_keep=keep, enable_async_checkpointing=True, create=True)
        self._manager = ocp.CheckpointManager(self.directory, options=options, item_names=("trainer", "meta"))

    def due(self, steps_done: int) -> bool:
        """Whether the periodic policy saves after `steps_done` steps."""
        return self.every > 0 and steps_done % self.every == 0

    def save(self, steps_done: int, trainer_state: dict[str, Any], meta: dict[str, Any]) -> None:
        """Start saving; returns once the arrays are copied (the trainer may then donate them)."""
        arrays = {k: v for k, v in trainer_state.items() if k != "version"}
        meta = {**meta, "trainer_version": int(trainer_state["version"])}
        self._manager.save(
            steps_done,
            args=ocp.args.Composite(trainer=ocp.args.StandardSave(arrays), meta=ocp.args.JsonSave(meta)),
            force=True,
        )

    def latest_step(self) -> int | None:
        return self._manager.latest_step()

    def restore(self, trainer_template: dict[str, Any], step: int | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
        """(trainer state for `Trainer.load_state_dict`, meta) of `step` (default: the newest)."""
        step = self.latest_step() if step is None else step
        if step is None:
            raise ValueError(f"resume: no checkpoint in {self.directory}")
        template = {k: v for k, v in trainer_template.items() if k != "version"}
        restored = self._manager.restore(
            step,
            args=ocp.args.Composite(trainer=ocp.args.StandardRestore(template), meta=ocp.args.JsonRestore()),
        )
        meta = dict(restored["meta"])
        return {**restored["trainer"], "version": meta["trainer_version"]}, meta

    def wait(self) -> None:
        self._manager.wait_until_finished()

    def close(self) -> None:
        self._manager.wait_until_finished()
        self._manager.close()


def truncate(path: Path, size: int) -> None:
    """Cut a log file (ledger, metrics) back to its length at the checkpoint: lines written after
    the save describe work the resumed run redoes, and must not be counted twice."""
    if not path.exists():
        if size:
            raise ValueError(f"resume: {path} is missing but the checkpoint recorded {size} bytes of it")
        return
    if path.stat().st_size < size:
        raise ValueError(f"resume: {path} has {path.stat().st_size} bytes, fewer than the {size} the checkpoint recorded")
    with open(path, "r+b") as fh:
        fh.truncate(size)
