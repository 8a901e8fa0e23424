"""Reading a task's JSONL file, all of it, at start-up: a bad line names FILE:LINE and the fix."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def read_jsonl(path: str | Path, fields: dict[str, type | tuple[type, ...]]) -> list[tuple[int, dict[str, Any]]]:
    """`(line number, object)` for each non-blank line; every object must have `fields` of those types."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"task.path={str(path)!r}: no such file")
    rows = []
    with path.open(encoding="utf-8") as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{number}: not valid JSON ({e.msg} at column {e.colno})") from None
            if not isinstance(row, dict):
                raise ValueError(f"{path}:{number}: must be a JSON object, got {type(row).__name__}")
            for key, kind in fields.items():
                if key not in row:
                    raise ValueError(f"{path}:{number}: missing field {key!r} (has {sorted(row)})")
                if not isinstance(row[key], kind):
                    raise ValueError(f"{path}:{number}: field {key!r}={row[key]!r} has the wrong type")
            rows.append((number, row))
    if not rows:
        raise ValueError(f"task.path={str(path)!r}: the file has no examples")
    return rows
