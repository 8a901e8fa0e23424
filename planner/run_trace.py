"""The timing trace of a real run, `run_dir/trace.jsonl` (docs/calibration.md): what the
simulator's cost model is fitted to (`planner.calibrate`) and what a replay reads its groups from
(`workload=trace workload.path=RUN_DIR/trace.jsonl`).

One JSON object a line, each with `event` and `t` — seconds since the run began on a monotonic
clock, earlier segments of a resumed run included (the runtime's `Controller.now`):

    {"event": "run", "t", "step", "policy", "max_staleness", "batch_groups", "group_size",
     "admission_window", "max_new_tokens",
     "engine", "workers", "slots", "kv_tokens", "sync_mode", "adapter_versions", "colocated"}
                                                                        each segment's start
        colocated: the engine runs on the trainer's devices (JAX engine, engine.colocate=true)
        adapter_versions: with sync_mode "pinned" only, the adapter versions a worker holds at once
    {"event": "admit", "t", "uid", "attempt", "prompt_id", "prompt_tokens", "version"}
    {"event": "start", "t", "uid", "attempt", "version", "worker"}      first token streamed
    {"event": "finish", "t", "uid", "attempt", "lengths": [tokens per sample]}  last sample done
    {"event": "lost", "t", "uid", "attempt"}            attempt given up (fault, stall, restart)
    {"event": "drop", "t", "uid"}
    {"event": "train", "t", "step", "start", "end", "groups", "tokens", "prompt_tokens"}
        t: the batch was handed over; start/end: the optimizer step; tokens: response tokens,
        prompt_tokens: prompt tokens of every sample (what sim.trainer.c1 multiplies)
    {"event": "publish", "t", "version"}                the trainer published `version`
    {"event": "load", "t", "version", "worker", "s"}     a worker began loading it, for `s` seconds
    {"event": "synced", "t", "version"}                  every worker holds it (the push returned)
    {"event": "decode", "t", "worker", "active", "calls", "steps", "tokens", "prefill_tokens", "s"
     [, "compile": true] [, "train": true] [, "drafted", "accepted"]}
    {"event": "migrate", "t", "uid", "from", "to", "s" [, "prefill_tokens"]}   a running group moved
        from replica `from` to `to`; s: the move took this long (abort, transfer, re-prefill, up to
        the target's first token); prefill_tokens: prompt + prefix tokens the target prefilled
    {"event": "episode", "t", "uid", "sample", "turns", "fault"}   a multi-turn episode finished
        sample: its index in group `uid`; turns: [[queued_s, gen_s, env_s], ...] per model turn
        (waiting for an engine slot, generating, in the environment step that followed); fault:
        the kind of the environment fault that ended it early (a string), or null

The `run` line carries `"speculation": {"when", "method", "tokens", "draft_model", "ngram",
"max_active"}` when the engine speculates (`engine.speculation.*`, when ≠ never; the engine's facts,
jaxrl_async/engines/registry.py); `planner.calibrate` needs `tokens` (k) to turn the measured share
of drafted tokens kept into the simulator's per-token acceptance.

`LINES` below is this list as code, the one both sides use: `TraceWriter.write` refuses a line
that misses a required key or carries one the schema does not declare, and `read_run_trace` hands
the readers `TraceLine`s, which refuse to read an undeclared key. So every key a reader takes is
declared, and a real run's trace holds every declared key (tests/jaxrl_async/runtime/
test_tracing.py) — but `migrate`, which the runtime does not trace yet: its lines come from
hand-written traces only.

`decode` lines aggregate the engine's iterations between two step ends, per worker and per mean
active count (round(tokens / steps)): one line per decode call would be thousands a step. The sums
are exactly what a least-squares fit of `s = α·steps + β·tokens + p·prefill_tokens` needs.
Iterations that compiled a jitted step are kept apart (`compile`): their time is XLA's, not the step's.
Speculating iterations (drafted > 0) are kept apart too and carry `drafted` / `accepted` (draft
tokens proposed / kept by the verification); their `tokens` count the accepted drafts, each
verification emitting one token of its own beside them, so their active count is
round((tokens − accepted) / steps): speculating and plain lines at the same count compare.
Iterations whose midpoint falls inside a trainer step (batch handed over -> version published) are
kept apart too (`train`): on a colocated engine they share the devices with the step, and their
ratio to the others is what `planner.calibrate` fits `sim.workers.colocated_slowdown` to.
Engines that report no timings (vLLM, also in Ray workers) leave out `load` and `decode`.

Durability is the ledger's (planner/ledger.py): lines are buffered, flushed at every step end
with the ledger, a resume cuts the file back to the checkpoint's recorded length, and a torn last
line (no newline) is skipped by `read_run_trace`.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from planner.jsonl import JsonlWriter, read_jsonl_lines

TRACE_FILE = "trace.jsonl"


@dataclass(frozen=True)
class LineKeys:
    """The keys a line kind carries besides `event` and `t`: `required` on every line (the reader
    refuses a line without one), `optional` where the run has the feature (a speculating engine,
    a colocated one, ...)."""

    required: tuple[str, ...]
    optional: tuple[str, ...] = ()

    @property
    def allowed(self) -> frozenset[str]:
        return frozenset(("event", "t", *self.required, *self.optional))


# The schema: every line kind and its keys. The writer writes nothing outside it and the readers
# read nothing outside it (`TraceLine`), so a key a reader takes is a key some writer writes
# (tests/jaxrl_async/runtime/test_tracing.py holds a real run's trace to it).
LINES = {
    "run": LineKeys(("step", "group_size", "workers", "slots"),
                    ("policy", "max_staleness", "batch_groups", "admission_window", "max_new_tokens", "engine",
                     "kv_tokens", "sync_mode", "adapter_versions", "colocated", "speculation")),
    "admit": LineKeys(("uid", "attempt", "prompt_id", "prompt_tokens", "version")),
    "start": LineKeys(("uid", "attempt", "version", "worker")),
    "finish": LineKeys(("uid", "attempt", "lengths")),
    "lost": LineKeys(("uid", "attempt")),
    "drop": LineKeys(("uid",)),
    "train": LineKeys(("step", "start", "end", "groups", "tokens", "prompt_tokens")),
    "publish": LineKeys(("version",)),
    "load": LineKeys(("version", "worker", "s")),
    "synced": LineKeys(("version",)),
    "decode": LineKeys(("worker", "active", "calls", "steps", "tokens", "prefill_tokens", "s"),
                       ("compile", "train", "drafted", "accepted")),
    "migrate": LineKeys(("uid", "from", "to", "s"), ("prefill_tokens",)),
    "episode": LineKeys(("uid", "sample", "turns", "fault")),
}
EVENTS = tuple(LINES)
# A section a line nests: the run line's `speculation` is the engine's `engine.speculation.*`.
SECTIONS = {("run", "speculation"): LineKeys((), ("when", "method", "tokens", "draft_model", "ngram", "max_active"))}


class TraceLine(dict):
    """One line as the readers get it: a dict that refuses to read a key its kind does not
    declare (`LINES`), so that a reader cannot come to depend on a key no writer writes. A
    declared key the line lacks reads as usual (`get` gives None, `[]` raises KeyError)."""

    __slots__ = ("kind", "keys_allowed")

    def __init__(self, obj: dict[str, Any], kind: str, keys: LineKeys) -> None:
        super().__init__(obj)
        self.kind, self.keys_allowed = kind, keys.allowed
        for (owner, name), section in SECTIONS.items():
            if owner == kind and isinstance(obj.get(name), dict):
                dict.__setitem__(self, name, TraceLine(obj[name], f"{kind}.{name}", section))

    def _check(self, key: Any) -> None:
        if key not in self.keys_allowed:
            raise KeyError(f"{key!r}: not a key of a trace {self.kind} line (planner/run_trace.py LINES declares "
                           f"{', '.join(sorted(self.keys_allowed))})")

    def __getitem__(self, key: Any) -> Any:
        self._check(key)
        return dict.__getitem__(self, key)

    def get(self, key: Any, default: Any = None) -> Any:
        self._check(key)
        return dict.get(self, key, default)

    def __contains__(self, key: Any) -> bool:
        self._check(key)
        return dict.__contains__(self, key)


def undeclared(event: str, fields: dict[str, Any]) -> str | None:
    """What is wrong with a line of kind `event` carrying `fields` (besides `event` and `t`) by
    the schema: an unknown kind, a missing required key, a key or a section key it does not
    declare; None when nothing is."""
    keys = LINES.get(event)
    if keys is None:
        return f"'{event}' is not a trace line kind (known: {', '.join(EVENTS)})"
    missing = [k for k in keys.required if k not in fields]
    if missing:
        return f"a {event} line misses '{missing[0]}'"
    extra = sorted(set(fields) - keys.allowed)
    if extra:
        return f"a {event} line declares no '{extra[0]}' (add it to planner/run_trace.py LINES and a reader)"
    for (owner, name), section in SECTIONS.items():
        if owner == event and isinstance(fields.get(name), dict):
            extra = sorted(set(fields[name]) - section.allowed)
            if extra:
                return f"a {event} line's {name} declares no '{extra[0]}' (planner/run_trace.py SECTIONS)"
    return None


class TraceWriter(JsonlWriter):
    """Buffered trace lines; `flush(sync=True)` at the runtime's step ends (as the ledger)."""

    def write(self, event: str, t: float, **fields: Any) -> None:
        """One line; a ValueError for a line the schema (`LINES`) does not hold, before anything
        is written: a writer cannot drift from what the readers read."""
        wrong = undeclared(event, fields)
        if wrong is not None:
            raise ValueError(f"{self.path}: {wrong}")
        self.append({"event": event, "t": round(t, 6), **fields})

    def decode(self, t: float, calls: list[tuple]) -> None:
        """One `decode` line per (worker, mean active count, compiled, training, speculating) of
        `calls`: (worker, seconds, steps, tokens, prefill tokens, compiled, training[, drafted,
        accepted]) of each engine iteration since the last call. Iterations that compiled a step
        go to lines of their own, marked `"compile": true`; those that ran during a trainer step,
        `"train": true`; those that speculated (drafted > 0), lines with `drafted` and `accepted`."""
        sums: dict[tuple[int, int, bool, bool, bool], list[float]] = defaultdict(lambda: [0, 0, 0, 0, 0.0, 0, 0])
        for worker, seconds, steps, tokens, prefill, compiled, training, *spec in calls:
            drafted, accepted = spec if spec else (0, 0)
            active = round((tokens - accepted) / steps) if steps else 0
            s = sums[(worker, active, compiled, training, drafted > 0)]
            s[0] += 1
            s[1] += steps
            s[2] += tokens
            s[3] += prefill
            s[4] += seconds
            s[5] += drafted
            s[6] += accepted
        for (worker, active, compiled, training, spec), (n, steps, tokens, prefill, seconds, drafted, accepted) \
                in sorted(sums.items()):
            extra = ({"compile": True} if compiled else {}) | ({"train": True} if training else {}) \
                | ({"drafted": drafted, "accepted": accepted} if spec else {})
            self.write("decode", t, worker=worker, active=active, calls=n, steps=steps, tokens=tokens,
                       prefill_tokens=prefill, s=round(seconds, 6), **extra)


def during_steps(start: float, seconds: float, windows: list[tuple[float, float]]) -> bool:
    """Whether an engine iteration that began at `start` and took `seconds` ran during one of the
    trainer steps `windows` ((handed over, published) run seconds): its midpoint decides, so an
    iteration straddling a step's edge goes where most of it ran."""
    mid = start + seconds / 2
    return any(a <= mid < b for a, b in windows)


def read_run_trace(path: str | Path) -> Iterator[TraceLine]:
    """Yield the trace's events; a malformed line is a one-line ValueError naming file and line.
    A last line without its newline that is not valid JSON is a write torn by a kill: skipped."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{path}: no such trace file (a run writes RUN_DIR/{TRACE_FILE})")
    for lineno, obj in read_jsonl_lines(path):
        yield check_event(obj, f"{path}:{lineno}")


def check_event(obj: Any, where: str) -> TraceLine:
    if not isinstance(obj, dict):
        raise ValueError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    event = obj.get("event")
    if event not in LINES:
        raise ValueError(f"{where}: 'event'={event!r}: not a run-trace event (known: {', '.join(EVENTS)})")
    keys = LINES[event]
    for name in ("t", *keys.required):
        if name not in obj:
            raise ValueError(f"{where}: {event} line misses field '{name}'")
    return TraceLine(obj, event, keys)


def is_run_trace_line(obj: Any) -> bool:
    """A run-trace line (an `event` key) rather than a workload-trace group line (docs/design.md §8.4)."""
    return isinstance(obj, dict) and "event" in obj


def finished_groups(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each group whose generation finished, in admission (stream) order: its prompt id, prompt
    tokens and per-sample lengths of its last finished attempt. Groups still generating at the
    run's end have no lengths and are left out."""
    admits: dict[int, dict[str, Any]] = {}
    lengths: dict[int, list[int]] = {}
    for e in events:
        if e["event"] == "admit" and e["uid"] not in admits:
            admits[e["uid"]] = e
        elif e["event"] == "finish":
            lengths[e["uid"]] = e["lengths"]
    return [{"prompt_id": a["prompt_id"], "prompt_tokens": a["prompt_tokens"], "lengths": lengths[uid]}
            for uid, a in sorted(admits.items()) if uid in lengths]
