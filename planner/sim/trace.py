"""Workload traces (docs/design.md §8): one group a line, `{"prompt_id": P, "lengths": [l1, ..., ln]}`
with an optional `"prompt_tokens": m`.

A real run's timing trace (`RUN_DIR/trace.jsonl`, planner/run_trace.py, docs/calibration.md) is
read as a workload trace too: its finished groups in admission order, each with its samples'
lengths and its prompt tokens — so `workload=trace workload.path=RUN_DIR/trace.jsonl` replays the
run's groups. The format is told apart by its first line (run-trace lines carry `event`).

A trace records real response lengths (from a serving log or an earlier training run) so that the
simulator replays them instead of a synthetic distribution. Every malformed line is a `ValueError`
naming the file and the line, so a bad trace fails before a long sweep starts.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from planner.run_trace import finished_groups, is_run_trace_line, read_run_trace

# Far above any context window, and small enough that a group's or a batch's token sums stay
# exact in the simulator's int64 arrays (a length of 10^20 does not fit one at all).
MAX_TOKENS = 2**31 - 1


@dataclass(frozen=True, slots=True)
class TraceGroup:
    prompt_id: int | str
    lengths: tuple[int, ...]  # response tokens of each trajectory of the group
    prompt_tokens: int | None = None


def _int_list(value: object, where: str, name: str) -> tuple[int, ...]:
    if not isinstance(value, list) or not value:
        raise ValueError(f"{where}: '{name}' must be a non-empty list of integers, got {value!r}")
    out = []
    for x in value:
        if isinstance(x, bool) or not isinstance(x, int):
            raise ValueError(f"{where}: '{name}' holds {x!r}: must be integers")
        if x < 0:
            raise ValueError(f"{where}: '{name}' holds {x}: lengths must be >= 0")
        if x > MAX_TOKENS:
            raise ValueError(f"{where}: '{name}' holds {x}: lengths must be <= {MAX_TOKENS}")
        out.append(x)
    return tuple(out)


def parse_trace_line(line: str, where: str) -> TraceGroup:
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as e:
        raise ValueError(f"{where}: not valid JSON ({e.msg})") from None
    return trace_group(obj, where)


def trace_group(obj: Any, where: str) -> TraceGroup:
    """One group of a workload trace from its JSON object; a bad field is a ValueError at `where`."""
    if not isinstance(obj, dict):
        raise ValueError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    if "lengths" not in obj:
        raise ValueError(f"{where}: missing field 'lengths'")
    if "prompt_id" not in obj:
        raise ValueError(f"{where}: missing field 'prompt_id'")
    prompt_tokens = obj.get("prompt_tokens")
    if prompt_tokens is not None and (isinstance(prompt_tokens, bool) or not isinstance(prompt_tokens, int)
                                      or not 0 <= prompt_tokens <= MAX_TOKENS):
        raise ValueError(f"{where}: 'prompt_tokens'={prompt_tokens!r}: must be an integer in [0, {MAX_TOKENS}]")
    return TraceGroup(obj["prompt_id"], _int_list(obj["lengths"], where, "lengths"), prompt_tokens)


def read_trace(path: str | Path, group_size: int | None = None) -> list[TraceGroup]:
    """All groups of the trace; with `group_size`, every line must hold exactly that many lengths."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"workload.path={path}: no such file")
    if _is_run_trace(path):
        finished = finished_groups(list(read_run_trace(path)))
        lines: list[tuple[str, Any]] = [(f"{path}: finished group {i}", obj) for i, obj in enumerate(finished)]
    else:
        with open(path, encoding="utf-8") as fh:
            lines = [(f"{path}:{lineno}", line) for lineno, line in enumerate(fh, 1) if line.strip()]
    groups = []
    for where, line in lines:
        g = parse_trace_line(line, where) if isinstance(line, str) else trace_group(line, where)
        if group_size is not None and len(g.lengths) != group_size:
            raise ValueError(f"{where}: 'lengths' has {len(g.lengths)} entries, group_size={group_size}")
        groups.append(g)
    if not groups:
        raise ValueError(f"{path}: the trace holds no groups")
    return groups


def _is_run_trace(path: Path) -> bool:
    """Whether the file's first non-blank line is a run-trace line (planner/run_trace.py)."""
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            if line.strip():
                try:
                    return is_run_trace_line(json.loads(line))
                except json.JSONDecodeError:
                    return False  # parse_trace_line names the line
    return False


def write_trace(path: str | Path, groups: Iterable[TraceGroup]) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        for g in groups:
            obj: dict[str, object] = {"prompt_id": g.prompt_id, "lengths": list(g.lengths)}
            if g.prompt_tokens is not None:
                obj["prompt_tokens"] = g.prompt_tokens
            fh.write(json.dumps(obj) + "\n")
