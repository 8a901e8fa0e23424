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

Integrity: once a save has committed (orbax renamed its folder to the step's number), a manifest
`checkpoints/N/manifest.json` records each of its files' size and CRC-32 (`write_manifest`;
zlib.crc32 reads MB/s in the GBs, so checking a checkpoint costs a fraction of restoring it). It is
written when the next save starts or at `wait` / `close` (orbax finishes one save before the next
anyway), so a kill can leave the newest checkpoint without one. `damage(step)` compares the files
with it before a restore — a truncated, rewritten or missing file is named in one line — and a
checkpoint without a manifest (killed before it was written, or saved before manifests existed) is
unverified: its restore decides. A restore that fails for any reason but a tree mismatch raises
`CheckpointDamaged` naming the item and what is wrong (the first line of the innermost error: the
array and the fault); job/resume.py then falls back to the next older checkpoint in one warning line.

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
import json
import logging
import os
import re
import shutil
import sys
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import jax
import orbax.checkpoint as ocp

from jaxrl_async.trees import TreeMismatch, check_like  # TreeMismatch: `restore` raises it, callers import it from here

CHECKPOINT_DIR = "checkpoints"
MANIFEST_FILE = "manifest.json"  # in each step's folder: {relative path: [bytes, crc32]}
DAMAGED_SUFFIX = ".damaged"  # a damaged checkpoint set aside by a resume: `N.damaged`, ignored by orbax

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


_ORBAX_READ_ERROR = "Encountered error while reading array index"  # orbax's wrapper of a failed array read


def _drop_abandoned_orbax_io(report_unraisable: Callable[[Any], None]) -> Callable[[Any], None]:
    """When the disk fills, orbax's other writes of that save are abandoned: coroutines holding
    tensorstore's error and callbacks into an event loop that has closed, which Python reports one
    by one as it collects them (dozens of "Exception ignored" tracebacks, each with a TensorStore
    spec dump). A restore of a damaged checkpoint abandons its other array reads the same way. The
    `CheckpointWriteError` or `CheckpointDamaged` line already says it; every other report still
    goes to `report_unraisable`."""
    def hook(unraisable: Any) -> None:
        error = unraisable.exc_value
        abandoned_write = tensorstore_errno(error) is not None or (
            isinstance(error, RuntimeError) and str(error) == "Event loop is closed")
        abandoned_read = str(error).startswith(_ORBAX_READ_ERROR)
        if not (abandoned_write or abandoned_read):
            report_unraisable(unraisable)
    return hook


sys.unraisablehook = _drop_abandoned_orbax_io(sys.unraisablehook)


class CheckpointDamaged(ValueError):
    """A checkpoint that fails its manifest or its restore: `what` names the file (or item) and
    the fault, in one line."""

    def __init__(self, step: int, what: str) -> None:
        super().__init__(f"{CHECKPOINT_DIR}/{step} is damaged ({what})")
        self.step, self.what = step, what


def _crc32(path: Path) -> int:
    crc = 0
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 22):
            crc = zlib.crc32(chunk, crc)
    return crc


def _files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file() and p.name != MANIFEST_FILE)


def write_manifest(folder: Path) -> None:
    """Record every file of a committed checkpoint folder (size, CRC-32), atomically: a kill
    mid-write leaves no manifest (unverified), never a wrong one."""
    manifest = {str(p.relative_to(folder)): [p.stat().st_size, _crc32(p)] for p in _files(folder)}
    tmp = folder / f"{MANIFEST_FILE}.tmp"
    tmp.write_text(json.dumps(manifest, sort_keys=True))
    os.replace(tmp, folder / MANIFEST_FILE)


def manifest_damage(folder: Path) -> str | None:
    """"<file>: <what>" for the first file of `folder` that differs from its manifest (missing,
    another size, another checksum), or for an unreadable manifest; None when every file matches
    or when there is no manifest (unverified: the restore decides)."""
    path = folder / MANIFEST_FILE
    if not path.exists():
        return None
    try:
        manifest = json.loads(path.read_text())
        entries = [(name, int(size), int(crc)) for name, (size, crc) in manifest.items()]
    except (ValueError, TypeError, AttributeError, UnicodeDecodeError) as e:
        return f"{MANIFEST_FILE}: unreadable ({type(e).__name__})"
    for name, size, crc in entries:
        file = folder / name
        if not file.is_file():
            return f"{name}: missing"
        actual = file.stat().st_size
        if actual != size:
            return f"{name}: {actual} bytes, the manifest recorded {size}"
        if _crc32(file) != crc:
            return f"{name}: checksum differs from the manifest"
    return None


_OCDBT_FILE = re.compile(r' in OCDBT database at local file "[^"]*"')


def _root_cause(error: BaseException) -> str:
    """What is wrong, in one line: the first line of the innermost error of the chain. orbax
    wraps tensorstore's read error — which names the array and the fault (`OUT_OF_RANGE: Error
    reading "params.embed/0.0": Requested byte range [0, 62567) is not valid for value of size
    100`) — in one that names only a slice and dumps a TensorStore spec; the checkpoint's folder
    is named by the caller, so the file path inside the message goes."""
    while (error.__cause__ or error.__context__) is not None:
        error = error.__cause__ or error.__context__
    text = _OCDBT_FILE.sub("", str(error)).strip().splitlines()
    line = text[0] if text else ""
    return f"{type(error).__name__}: {line[:200]}" if line else type(error).__name__


# GB of the trainer's arrays a save encodes and writes at once. orbax's default (96) lets
# tensorstore encode the whole state into chunk buffers before they reach the disk: +1.36 GiB of
# transient host memory for SmolLM2-135M's 1.5 GiB, against +0.34 GiB at 0.25 (and the save took
# 2.8 s instead of 5-13 s here: the disk, not the encoding, bounds it); docs/memory.md.
SAVE_CONCURRENT_GB = 0.25


class Checkpointer:
    def __init__(self, run_dir: str | Path, *, keep: int = 2, every: int = 0) -> None:
        if keep < 1:
            raise ValueError(f"keep_checkpoints={keep}: must be >= 1")
        if every < 0:
            raise ValueError(f"checkpoint_every={every}: must be >= 0 (0 = only on stop and at the end)")
        self.directory = Path(run_dir).absolute() / CHECKPOINT_DIR
        self.every = every
        self._failed = False  # a save failed: reported once, `close` does not raise it again
        self._unsealed: list[int] = []  # saved steps whose manifest is not written yet
        options = ocp.CheckpointManagerOptions(max_to_keep=keep, enable_async_checkpointing=True, create=True,
                                               cleanup_tmp_directories=True)
        with self._disk_errors():
            self._manager = ocp.CheckpointManager(
                self.directory, options=options,
                item_handlers={"trainer": ocp.StandardCheckpointHandler(save_concurrent_gb=SAVE_CONCURRENT_GB),
                               "meta": ocp.JsonCheckpointHandler()})

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
            self._seal()  # orbax finishes the previous save before starting this one anyway
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
        self._unsealed.append(steps_done)

    def _seal(self) -> None:
        """Wait for the save in progress, then write the manifest of every committed step (process
        0 only: in a multi-host job every process saves its shards into the same folders, and the
        commit orbax waits for here spans them all)."""
        self._manager.wait_until_finished()
        for step in self._unsealed if jax.process_index() == 0 else ():
            folder = self.directory / str(step)
            if folder.is_dir():  # not yet removed by `keep`
                write_manifest(folder)
        self._unsealed = []

    def all_steps(self) -> list[int]:
        """The finished checkpoints' steps, newest first."""
        with self._disk_errors():
            return sorted(self._manager.all_steps(), reverse=True)

    def damage(self, step: int) -> str | None:
        """"<file>: <what>" when `step`'s files differ from its manifest; None when they match or
        it has none (`manifest_damage`)."""
        return manifest_damage(self.directory / str(step))

    def set_aside(self, step: int) -> Path:
        """Rename a damaged checkpoint to `N.damaged` (kept for a look; orbax no longer lists it,
        so the resumed run saves step N afresh instead of keeping the damaged one)."""
        target = self.directory / f"{step}{DAMAGED_SUFFIX}"
        with self._disk_errors():
            if target.exists():
                shutil.rmtree(target)
            os.replace(self.directory / str(step), target)
            self._manager.reload()
        return target

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
        with self._damaged(step, "meta"):
            restored = self._manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))
            meta = restored["meta"]
            if not isinstance(meta, dict):
                raise ValueError(f"not a JSON object: {type(meta).__name__}")
        return dict(meta)

    @contextlib.contextmanager
    def _damaged(self, step: int, item: str) -> Iterator[None]:
        """Any failure to read `step` (orbax's, tensorstore's, a missing or garbled file) is one
        `CheckpointDamaged` line naming the item: the resume falls back to an older checkpoint."""
        try:
            yield
        except TreeMismatch:
            raise
        except Exception as e:  # noqa: BLE001 - whatever a damaged file makes orbax raise
            raise CheckpointDamaged(step, f"{item}: {_root_cause(e)}") from None

    def restore(self, trainer_template: dict[str, Any], step: int | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
        """(trainer state for `Trainer.load_state_dict`, meta) of `step` (default: the newest).
        Arrays whose paths, shapes or dtypes differ from `trainer_template` raise `TreeMismatch`
        (re-exported here: the entry point catches it to name the model source)."""
        step = self._step(step)
        template = {k: v for k, v in trainer_template.items() if k != "version"}
        with self._damaged(step, "trainer"):
            saved = self._manager.item_metadata(step)["trainer"]
        check_like(template, getattr(saved, "tree", saved), "the checkpoint")
        with self._damaged(step, "trainer"):
            restored = self._manager.restore(
                step,
                args=ocp.args.Composite(trainer=ocp.args.StandardRestore(template), meta=ocp.args.JsonRestore()),
            )
            meta = dict(restored["meta"])
            version = int(meta["trainer_version"])
        return {**restored["trainer"], "version": version}, meta

    def wait(self) -> None:
        with self._disk_errors():
            self._seal()

    def wait_written(self) -> None:
        """Return once the save in progress has written its arrays (and reads them no more): what
        the trainer waits for before it donates them (`Trainer.lend`). The manifest is left to
        the next save or `wait`. A failed background save raises here (`CheckpointWriteError`)."""
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
