"""Record the event stream a driver feeds a policy, and replay it on a fresh policy.

A policy is synchronous and clock-free, so its decisions are a function of the
calls it received. The parity test proves it: record every call the simulator (or the runtime)
makes, with its arguments and the returned `Decision`, replay the calls on a new policy object and
compare. `dump`/`load` write the stream as JSONL so the runtime's parity test can reuse it.
"""

from __future__ import annotations

import copy
import dataclasses
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from planner.types import Admission, Candidate, Decision, Drop, Move

EVENT_METHODS = (
    "admit", "on_group_started", "on_tokens", "on_group_finished", "on_version_published",
    "on_version_synced", "on_engine_stats", "select_batch", "on_step_done", "on_group_lost", "finish",
)


@dataclass
class Call:
    method: str
    kwargs: dict[str, Any]
    decision: Decision


class RecordingPolicy:
    """Forwards every event method to `policy` and appends a `Call`; everything else passes through."""

    def __init__(self, policy: Any, calls: list[Call]) -> None:
        self._policy = policy
        self._calls = calls

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._policy, name)
        if name not in EVENT_METHODS:
            return attr

        def record(**kwargs: Any) -> Decision:
            frozen = {k: tuple(v) if k == "candidates" else copy.deepcopy(v) for k, v in kwargs.items()}
            decision = attr(**kwargs)
            self._calls.append(Call(name, frozen, copy.deepcopy(decision)))
            return decision

        return record


class EventRecorder:
    def __init__(self) -> None:
        self.calls: list[Call] = []

    def wrap(self, policy: Any) -> RecordingPolicy:
        return RecordingPolicy(policy, self.calls)

    def dump(self, path: str | Path) -> None:
        with open(path, "w", encoding="utf-8") as fh:
            for c in self.calls:
                fh.write(json.dumps({"method": c.method, "kwargs": _encode(c.kwargs), "decision": _encode(c.decision)}) + "\n")

    @staticmethod
    def load(path: str | Path) -> list[Call]:
        calls = []
        with open(path, encoding="utf-8") as fh:
            for line in fh:
                obj = json.loads(line)
                kwargs = obj["kwargs"]
                if "candidates" in kwargs:
                    kwargs["candidates"] = tuple(Candidate(**c) for c in kwargs["candidates"])
                if "versions" in kwargs:
                    kwargs["versions"] = [tuple(v) for v in kwargs["versions"]]
                if "last_versions" in kwargs:
                    kwargs["last_versions"] = tuple(kwargs["last_versions"])
                calls.append(Call(obj["method"], kwargs, _decode_decision(obj["decision"])))
        return calls


def replay(calls: Iterable[Call], policy: Any) -> list[Decision]:
    """Feed `calls` to `policy` in order; returns its decisions."""
    return [getattr(policy, c.method)(**c.kwargs) for c in calls]


def first_divergence(calls: Sequence[Call], policy: Any) -> int | None:
    """Index of the first call where `policy` decides differently from the recording, or None."""
    for i, c in enumerate(calls):
        if _encode(getattr(policy, c.method)(**c.kwargs)) != _encode(c.decision):
            return i
    return None


def _encode(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: _encode(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, dict):
        return {k: _encode(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_encode(v) for v in obj]
    return obj


def _decode_decision(d: dict[str, Any]) -> Decision:
    return Decision(
        admit=[Admission(**a) for a in d["admit"]],
        drop=[Drop(**x) for x in d["drop"]],
        moves=[Move(**m) for m in d["moves"]],
        train=d["train"],
        critical=list(d.get("critical", [])),  # absent in traces recorded before the tail decisions
        migrate=list(d.get("migrate", [])),
    )
