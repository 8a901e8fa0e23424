"""The staleness ledger (docs/design.md §8): the proof that a run kept its bound.

Every path that trains — simulator or real runtime — writes `ledger.jsonl` through
`LedgerWriter`, one JSON object a line, in event order:

    {"event": "admit", "uid": U, "version": a, "deadline": d|null, "prompt": id}
    {"event": "start", "uid": U, "version": v}                      (extension: engine start)
    {"event": "train", "step": k, "groups": [{"uid": U, "versions": [[v, tokens], ...]
                                               [, "turns": [[sample, [[v, tokens], ...]], ...]]}, ...]}
    {"event": "drop",  "uid": U, "step": k, "reason": "...", "tokens": t[, "length": l]}
    {"event": "move",  "uid": U, "from": k1, "to": k2}
    {"event": "migrate", "uid": U, "from": w1, "to": w2, "versions": [[v, tokens], ...]}

`tokens` on a drop (an extension) is how many generated tokens the drop wasted. `length` (an
extension, written by the simulator, which knows the workload's true lengths) is the group's
whole completion length — what training it would have cost; the audit's length-bias certificate
prefers it to `tokens`, a lower bound (docs/design.md §8.2). `prompt` on an admit (an extension)
is the prompt's id, so that the prompts a run trained can be compared with another run's, across
restarts. A re-admission of an untrained uid (after a worker fault) is a second `admit` line. The
audit (`planner.audit`) recomputes everything from this file alone.

Durability: the writer buffers lines; `flush()` hands them to the operating system, which keeps
them through a SIGKILL of the process, and `flush(sync=True)` also asks the disk to (fsync). The
training runtime flushes at every step end, so a killed run loses at most the step in progress.
A kill in the middle of a write leaves a torn last line (no newline at its end): `read_ledger`
skips it, because it belongs to the step that was lost, and a resume cuts the file back to the
checkpoint's length anyway (docs/fault_tolerance.md).

`turns` on a trained group (an extension, written for multi-turn episodes) holds its per-turn
spans: one item per model turn, in turn order within each sample (`sample` is the episode's index
in the group), each with the versions of that turn's tokens. The audit checks that they add up,
version for version, to the group's `versions`, and that within a sample no turn samples on older
weights than the turn before it (a turn that starts after a weight update uses the newer weights).
Single-turn groups carry no `turns` key.

A `migrate` line says the running group U moved from engine replica (or simulated worker) w1 to
w2 with its generated prefix kept; `versions` are the prefix's token versions at the move. The
audit checks that the group's trained versions contain them, token for token: a move loses
no token and re-versions none (docs/design.md §2.14).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from planner.jsonl import JsonlWriter, read_jsonl_lines
from planner.types import Admission, Drop, Move, Versions

LEDGER_FILE = "ledger.jsonl"
Turns = Sequence[tuple[int, Versions]]  # (sample, versions) per model turn of a multi-turn group


class LedgerWriter(JsonlWriter):
    """Appends ledger events. Opened in append mode so a resumed run continues the same ledger."""

    def __init__(self, path: str | Path, *, append: bool = False, buffer_lines: int = 4096) -> None:
        super().__init__(path, append=append, buffer_lines=buffer_lines)

    def admit(self, a: Admission) -> None:
        self.append({"event": "admit", "uid": a.uid, "version": a.version, "deadline": a.deadline,
                     "prompt": a.prompt_id})

    def start(self, uid: int, version: int) -> None:
        self.append({"event": "start", "uid": uid, "version": version})

    def train(self, step: int, groups: Sequence[tuple[int, Versions] | tuple[int, Versions, Turns | None]]) -> None:
        """`groups`: (uid, versions) or (uid, versions, turns); `turns` ((sample, versions) per model
        turn, in order within each sample) writes the group's `turns` key, None leaves it out."""
        self.append({"event": "train", "step": step, "groups": [_trained_group(*g) for g in groups]})

    def drop(self, d: Drop, tokens: int = 0, length: int | None = None) -> None:
        event = {"event": "drop", "uid": d.uid, "step": d.step, "reason": d.reason, "tokens": tokens}
        if length is not None:
            event["length"] = length
        self.append(event)

    def move(self, m: Move) -> None:
        self.append({"event": "move", "uid": m.uid, "from": m.src, "to": m.dst})

    def moves(self, moves: Iterable[Move]) -> None:
        for m in moves:
            self.move(m)

    def migrate(self, uid: int, src: int, dst: int, versions: Versions) -> None:
        self.append({"event": "migrate", "uid": uid, "from": src, "to": dst,
                     "versions": [[v, t] for v, t in versions]})

    def __enter__(self) -> LedgerWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _trained_group(uid: int, versions: Versions, turns: Turns | None = None) -> dict[str, Any]:
    entry: dict[str, Any] = {"uid": uid, "versions": [[v, t] for v, t in versions]}
    if turns is not None:
        entry["turns"] = [[sample, [[v, t] for v, t in span]] for sample, span in turns]
    return entry


class NullLedger:
    """Stands in for `LedgerWriter` when a run needs no ledger file (the simulator's speed runs)."""

    def admit(self, a: Admission) -> None: ...
    def start(self, uid: int, version: int) -> None: ...
    def train(self, step: int, groups: Any) -> None: ...
    def drop(self, d: Drop, tokens: int = 0, length: int | None = None) -> None: ...
    def moves(self, moves: Any) -> None: ...
    def migrate(self, uid: int, src: int, dst: int, versions: Any) -> None: ...
    def flush(self) -> None: ...


class LedgerError(ValueError):
    """A ledger line that is not valid JSON or misses a field; the message names the line."""


def read_ledger(path: str | Path) -> Iterator[dict[str, Any]]:
    """Yield ledger events; a malformed line raises `LedgerError` naming file and line.

    A last line without its newline that is not valid JSON is a write torn by a kill: it is
    skipped (the writer ends every line it completes with a newline)."""
    path = Path(path)
    for lineno, obj in read_jsonl_lines(path, LedgerError):
        if not isinstance(obj, dict) or "event" not in obj:
            raise LedgerError(f"{path}:{lineno}: missing field 'event'")
        obj["_line"] = lineno
        yield obj
