"""The timing trace of a real run, `run_dir/trace.jsonl` (docs/calibration.md): what the
simulator's cost model is fitted to (`planner.calibrate`) and what a replay reads its groups from
(`workload=trace workload.path=RUN_DIR/trace.jsonl`).

One JSON object a line, each with `event` and `t` — seconds since the run began on a monotonic
clock, earlier segments of a resumed run included (the runtime's `Controller.now`):

    {"event": "run", "t", "step", "policy", "max_staleness", "batch_groups", "group_size",
     "admission_window", "max_new_tokens",
     "engine", "workers", "slots", "kv_tokens", "sync_mode", "colocated"}    each segment's start
        colocated: the engine runs on the trainer's devices (JAX engine, engine.colocate=true)
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

The `run` line may carry `"speculation": {"when", "tokens", "max_active"}` (an engine that
speculates: `engine.speculation.*`); `planner.calibrate` needs `tokens` (k) to turn the measured
share of drafted tokens kept into the simulator's per-token acceptance.

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
Engines that report no timings (vLLM, Ray workers) leave out `load` and `decode`.

Durability is the ledger's (planner/ledger.py): lines are buffered, flushed at every step end
with the ledger, a resume cuts the file back to the checkpoint's recorded length, and a torn last
line (no newline) is skipped by `read_run_trace`.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from planner.jsonl import JsonlWriter, read_jsonl_lines

TRACE_FILE = "trace.jsonl"
EVENTS = ("run", "admit", "start", "finish", "lost", "drop", "train", "publish", "load", "synced", "decode",
          "migrate")
# The fields each event must carry besides `event` and `t` (what the readers rely on).
FIELDS = {
    "run": ("step", "group_size", "workers", "slots"),
    "admit": ("uid", "attempt", "prompt_id", "prompt_tokens", "version"),
    "start": ("uid", "attempt", "version", "worker"),
    "finish": ("uid", "attempt", "lengths"),
    "lost": ("uid", "attempt"),
    "drop": ("uid",),
    "train": ("step", "start", "end", "groups", "tokens", "prompt_tokens"),
    "publish": ("version",),
    "load": ("version", "worker", "s"),
    "synced": ("version",),
    "decode": ("worker", "active", "calls", "steps", "tokens", "prefill_tokens", "s"),
    "migrate": ("uid", "from", "to", "s"),
}


class TraceWriter(JsonlWriter):
    """Buffered trace lines; `flush(sync=True)` at the runtime's step ends (as the ledger)."""

    def write(self, event: str, t: float, **fields: Any) -> None:
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


def read_run_trace(path: str | Path) -> Iterator[dict[str, Any]]:
    """Yield the trace's events; a malformed line is a one-line ValueError naming file and line.
    A last line without its newline that is not valid JSON is a write torn by a kill: skipped."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{path}: no such trace file (a run writes RUN_DIR/{TRACE_FILE})")
    for lineno, obj in read_jsonl_lines(path):
        yield check_event(obj, f"{path}:{lineno}")


def check_event(obj: Any, where: str) -> dict[str, Any]:
    if not isinstance(obj, dict):
        raise ValueError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    event = obj.get("event")
    if event not in FIELDS:
        raise ValueError(f"{where}: 'event'={event!r}: not a run-trace event (known: {', '.join(EVENTS)})")
    for name in ("t", *FIELDS[event]):
        if name not in obj:
            raise ValueError(f"{where}: {event} line misses field '{name}'")
    return obj


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
