"""The run's append-only JSON-lines files (`ledger.jsonl`, `trace.jsonl`): one writer and one
reader, so that both keep the same durability rule (docs/fault_tolerance.md).

Writing: lines are buffered in memory and handed to the OS by `flush` — which the runtime calls
at every step end, with `sync=True` to fsync — so a SIGKILL loses at most the step in progress.
Every completed line ends with a newline. Reading: a last line without its newline that is not
valid JSON is a write torn by a kill and is skipped; any other malformed line is an error naming
the file and the line.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any


class JsonlWriter:
    """Appends JSON objects as lines; `append=True` continues an existing file (a resumed run).
    `buffer_lines`: flush on its own after this many lines (None: only when told)."""

    def __init__(self, path: str | Path, *, append: bool = False, buffer_lines: int | None = None) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fh: IO[str] = open(self.path, "a" if append else "w", encoding="utf-8")
        self._lines: list[str] = []
        self._buffer_lines = buffer_lines

    def append(self, obj: dict[str, Any]) -> None:
        self._lines.append(json.dumps(obj, separators=(",", ":")))
        if self._buffer_lines is not None and len(self._lines) >= self._buffer_lines:
            self.flush()

    def flush(self, *, sync: bool = False) -> None:
        """Hand the buffered lines to the OS (enough to survive a SIGKILL); `sync`: also fsync, so
        that they survive a machine crash."""
        if self._lines:
            self._fh.write("\n".join(self._lines) + "\n")
            self._lines.clear()
        self._fh.flush()
        if sync:
            os.fsync(self._fh.fileno())

    def close(self) -> None:
        self.flush()
        self._fh.close()


def read_jsonl_lines(path: str | Path, error: type[ValueError] = ValueError) -> Iterator[tuple[int, Any]]:
    """(line number, parsed value) of each non-blank line; a torn last line is skipped, any other
    line that is not JSON raises `error` naming the file and the line."""
    with open(path, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                yield lineno, json.loads(line)
            except json.JSONDecodeError as e:
                if not line.endswith("\n"):
                    return  # the torn last line
                raise error(f"{path}:{lineno}: not valid JSON ({e.msg})") from None
