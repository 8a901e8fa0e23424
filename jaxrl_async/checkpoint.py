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

Cadence (`due`): after step 1 — so that a run killed at any later point has a checkpoint to
resume from — then every `every` steps, on a stop (SIGTERM, SIGINT) and at the end
(docs/fault_tolerance.md). A save interrupted by a kill leaves orbax's `*.orbax-checkpoint-tmp*`
folder, never a finished-looking step; `latest_step` ignores it and the next manager removes it.

Restoring reads `meta` first (`read_meta`: the entry point checks the run's settings before any
array is touched), then checks the checkpoint's array tree against the current trainer's — path, shape, dtype
(`jaxrl_async.trees.check_like`) — and names the first mismatch in one line (`TreeMismatch`)
instead of orbax's tree diff.

Disk errors (a read-only or full disk, a missing mount) surface as one line naming the checkpoint
directory and the errno (`CheckpointWriteError`). orbax also logs each such failure with its
traceback from its background threads; those log records are dropped, the one line replaces them.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import re
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orbax.checkpoint as ocp

from jaxrl_async.trees import TreeMismatch, check_like  # TreeMismatch: `restore` raises it, callers import it from here

CHECKPOINT_DIR = "checkpoints"

log = logging.getLogger(__name__)


class CheckpointWriteError(ValueError):
    """The checkpoint directory cannot be written (or read): one line with the errno."""


_TENSORSTORE_ERRNO = re.compile(r"os_error_code=\\?'(\d+)")  # also inside a repr, which escapes the quote


def tensorstore_errno(error: BaseException) -> int | None:
    """The errno inside a tensorstore write error (`ValueError: RESOURCE_EXHAUSTED: ... No space
    left on device [os_error_code='28']`): how a full disk reaches orbax's array writes."""
    found = _TENSORSTORE_ERRNO.search(str(error))
    return int(found.group(1)) if found else None


class _DropOrbaxDiskErrors(logging.Filter):
    """orbax logs a disk error of its background save (an OSError, or tensorstore's ValueError
    with an errno) once per thread, with a traceback or the error's text, and asyncio logs each of
    its abandoned write tasks; the Checkpointer re-raises the error as one `CheckpointWriteError`
    line, so those records are dropped."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        orbax_os_error = isinstance(error, OSError) and "orbax" in record.pathname
        tensorstore = (error is not None and tensorstore_errno(error) is not None) or \
            _TENSORSTORE_ERRNO.search(record.getMessage()) is not None
        return not (orbax_os_error or tensorstore)


_ORBAX_FILTER = _DropOrbaxDiskErrors()
logging.getLogger("absl").addFilter(_ORBAX_FILTER)
logging.getLogger("asyncio").addFilter(_ORBAX_FILTER)  # "Task exception was never retrieved" of orbax's writes


def _drop_abandoned_disk_writes(report_unraisable: Callable[[Any], None]) -> Callable[[Any], None]:
    """When the disk fills, orbax's other writes of that save are abandoned: coroutines holding
    tensorstore's error and callbacks into an event loop that has closed, which Python reports one
    by one as it collects them (dozens of "Exception ignored" tracebacks). The
    `CheckpointWriteError` line already says it; every other report still goes to `report_unraisable`."""
    def hook(unraisable: Any) -> None:
        error = unraisable.exc_value
        if tensorstore_errno(error) is None and not (isinstance(error, RuntimeError)
                                                     and str(error) == "Event loop is closed"):
            report_unraisable(unraisable)
    return hook


sys.unraisablehook = _drop_abandoned_disk_writes(sys.unraisablehook)


class Checkpointer:
    def __init__(self, run_dir: str | Path, *, keep: int = 2, every: int = 0) -> None:
        if keep < 1:
            raise ValueError(f"keep_checkpoints={keep}: must be >= 1")
        if every < 0:
            raise ValueError(f"checkpoint_every={every}: must be >= 0 (0 = only on stop and at the end)")
        self.directory = Path(run_dir).absolute() / CHECKPOINT_DIR
        self.every = every
        self._failed = False  # a save failed: reported once, `close` does not raise it again
        options = ocp.CheckpointManagerOptions(max_to_keep=keep, enable_async_checkpointing=True, create=True,
                                               cleanup_tmp_directories=True)
        with self._disk_errors():
            self._manager = ocp.CheckpointManager(
                self.directory, options=options,
                item_handlers={"trainer": ocp.StandardCheckpointHandler(), "meta": ocp.JsonCheckpointHandler()})

    @contextlib.contextmanager
    def _disk_errors(self) -> Iterator[None]:
        try:
            yield
        except OSError as e:
            raise self._write_error(e.errno, e.strerror or str(e)) from None
        except ValueError as e:  # tensorstore's (OCDBT) write errors carry the errno in their text
            number = tensorstore_errno(e)
            if number is None:
                raise
            raise self._write_error(number, os.strerror(number)) from None

    def _write_error(self, number: int | None, reason: str) -> CheckpointWriteError:
        self._failed = True
        code = errno.errorcode.get(number, "?") if number is not None else "?"
        return CheckpointWriteError(f"checkpoint: cannot write {self.directory}: [Errno {number} {code}] {reason}")

    def due(self, steps_done: int) -> bool:
        """Whether the periodic policy saves after `steps_done` steps: after the first step, then
        every `every` steps (0: never; only stops and the end save)."""
        return self.every > 0 and (steps_done == 1 or steps_done % self.every == 0)

    def save(self, steps_done: int, trainer_state: dict[str, Any], meta: dict[str, Any]) -> None:
        """Start saving; returns once the arrays are copied (the trainer may then donate them).
        An earlier background save that failed raises here (`CheckpointWriteError`).

        A step that already has a checkpoint keeps it: a stop that lands right after the periodic
        save (or right after a resume) finds its step's resume point on disk. Both are snapshots
        at the same step boundary; what was admitted in between is redone by the resume, which
        cuts the ledger back to the kept snapshot's length."""
        with self._disk_errors():
            if steps_done in self._manager.all_steps():
                log.info("checkpoint of step %d already saved: kept", steps_done)
                return
        arrays = {k: v for k, v in trainer_state.items() if k != "version"}
        meta = {**meta, "trainer_version": int(trainer_state["version"])}
        with self._disk_errors():
            self._manager.save(
                steps_done,
                args=ocp.args.Composite(trainer=ocp.args.StandardSave(arrays), meta=ocp.args.JsonSave(meta)),
                force=True,
            )

    def latest_step(self) -> int | None:
        with self._disk_errors():
            return self._manager.latest_step()

    def _step(self, step: int | None) -> int:
        step = self.latest_step() if step is None else step
        if step is None:
            raise ValueError(f"resume: no checkpoint in {self.directory}")
        return step

    def read_meta(self, step: int | None = None) -> dict[str, Any]:
        """The JSON meta of `step` (default: the newest), without reading any array."""
        step = self._step(step)
        with self._disk_errors():
            restored = self._manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))
        return dict(restored["meta"])

    def restore(self, trainer_template: dict[str, Any], step: int | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
        """(trainer state for `Trainer.load_state_dict`, meta) of `step` (default: the newest).
        Arrays whose paths, shapes or dtypes differ from `trainer_template` raise `TreeMismatch`
        (re-exported here: the entry point catches it to name the model source)."""
        step = self._step(step)
        template = {k: v for k, v in trainer_template.items() if k != "version"}
        with self._disk_errors():
            saved = self._manager.item_metadata(step)["trainer"]
        check_like(template, getattr(saved, "tree", saved), "the checkpoint")
        with self._disk_errors():
            restored = self._manager.restore(
                step,
                args=ocp.args.Composite(trainer=ocp.args.StandardRestore(template), meta=ocp.args.JsonRestore()),
            )
        meta = dict(restored["meta"])
        return {**restored["trainer"], "version": meta["trainer_version"]}, meta

    def wait(self) -> None:
        with self._disk_errors():
            self._manager.wait_until_finished()

    def close(self) -> None:
        """Wait for the last save and release orbax's threads. A failed save raises once: when it
        was already reported (by `save` or `wait`), `close` only cleans up."""
        reported = self._failed
        try:
            self.wait()
        except CheckpointWriteError:
            if not reported:
                raise
        finally:
            with contextlib.suppress(OSError):
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
