"""`python -m planner.tail RUN_DIR [--json]`: where the tail's time goes, for people.

Reads a training run's files (trace.jsonl, ledger.jsonl, metrics.jsonl) or a simulated run's
summary.json `tail` and prints the figures of planner/tail_analysis.py (docs/tail_analysis.md)
each with its unit (s, %, s/token, a quantile), then one verdict line: where the critical groups'
time goes and whether scheduling the tail (docs/design.md §2.14: speculation, migration) would
pay. A run with multi-turn episodes (the trace's `episode` lines) adds where their time goes:
generation, environment and waiting. `--json` prints the `tail` dict itself and nothing else.

The verdict reads the figures only. Tail scheduling can recover at most the part of the
trainer's wait that the last 5% of each batch causes — `wait_share_last_5pct ×
trainer_wait_fraction` of the run — so it pays when that is at least `PAYS` of the run. Which
lever: critical groups whose tokens cost `SLOW_WORKER`× the others' sit on a slow worker
(migration moves them); otherwise a critical group that is its batch's longest decodes alone at
the end, where a step costs about its weight-reading part (speculation turns that into tokens).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from planner.run_files import SUMMARY_FILE
from planner.run_trace import TRACE_FILE
from planner.tail_analysis import EPISODE_PARTS, PHASES, from_run_dir
from planner.tools import entry

PAYS = 0.10  # tail scheduling pays when it could recover at least this share of the run
SLOW_WORKER = 1.5  # critical tokens this many times dearer than the others': a slow worker
# Where a phase's seconds go, in words (planner/tail_analysis.py PHASES).
WHERE = {"queue_s": "queued", "prefill_s": "prefilling", "load_s": "loading weights", "decode_s": "decoding",
         "other_s": "in other work on their worker", "trainer_s": "waiting for the trainer"}
# Each scalar figure: its label and how it prints (docs/tail_analysis.md says what each means).
LINES = (
    ("groups", "groups with a full timing record", "count"),
    ("steps", "steps whose batch is among them", "count"),
    ("trainer_wait_s", "trainer waited for batches", "s"),
    ("trainer_wait_fraction", "trainer waited, share of the run", "%"),
    ("steps_bound_by_generation", "steps whose critical group finished after the trainer was ready", "%"),
    ("wait_share_last_5pct", "share of the wait caused by the last 5% of each batch", "%"),
    ("wait_share_last_group", "share of the wait caused by the critical group alone", "%"),
    ("critical_length_rank", "critical group's decode steps as a quantile of its batch's (1 = longest)", "q"),
    ("critical_is_longest", "steps whose critical group needed the most decode steps of its batch", "%"),
    ("update_load_s", "workers swapped in new weights (sum over workers)", "s"),
    ("update_held_s", "workers held new starts for a pending weight update (sum over workers)", "s"),
)


def _value(v: Any, unit: str) -> str:
    if v is None:
        return "unavailable"
    if unit == "%":
        return f"{100 * v:.1f}%"
    if unit == "s":
        return f"{v:.4g} s"
    if unit == "s/token":
        return f"{v:.4g} s/token"
    if unit == "q":
        return f"{v:.2f}"
    return str(v)


def verdict(t: Mapping[str, Any]) -> str:
    """One line: where the critical groups' time goes and whether tail scheduling would pay."""
    wait, last5 = t.get("trainer_wait_fraction"), t.get("wait_share_last_5pct")
    if not t.get("groups") or wait is None:
        return ("verdict: no timing record to judge (an engine that times no iterations, e.g. vLLM or Ray "
                "workers, or a run without a finished step)")
    phases = {p: v for p, v in t["mean_s"]["critical"].items() if v is not None}
    total = sum(phases.values())
    where = ""
    if total > 0:
        phase = max(phases, key=phases.get)
        where = (f"critical groups spend {100 * phases[phase] / total:.0f}% of their "
                 f"{total:.3g} s {WHERE[phase]}; ")
    recoverable = (last5 or 0.0) * wait
    if recoverable < PAYS:
        why = (f"the trainer waits only {100 * wait:.0f}% of the run" if wait < PAYS else
               f"only {100 * (last5 or 0.0):.0f}% of the trainer's wait ({100 * wait:.0f}% of the run) "
               f"is the last 5% of each batch")
        return (f"verdict: {where}tail scheduling would not pay: {why}, so it could recover at most "
                f"{100 * recoverable:.0f}% of the run")
    crit, other = t["decode_s_per_token"]["critical"]["p50"], t["decode_s_per_token"]["other"]["p50"]
    if crit is not None and other and crit >= SLOW_WORKER * other:
        lever = (f"critical tokens cost {crit / other:.1f}x the others' (a slow worker): migration "
                 f"(policy.migrate=true) is the lever")
    else:
        lever = "the straggler decodes alone at the end: speculation (speculation.when=critical) is the lever"
    return (f"verdict: {where}tail scheduling would pay: the last 5% of each batch keeps the trainer "
            f"waiting {100 * recoverable:.0f}% of the run; {lever}")


def report(t: Mapping[str, Any]) -> str:
    """The `tail` dict as lines for people, each figure with its unit, and the verdict."""
    lines = [f"{label}: {_value(t.get(key), unit)}" for key, label, unit in LINES]
    for kind in ("critical", "other"):
        q = t["decode_s_per_token"][kind]
        lines.append(f"decode time per token, {kind} groups: p50 {_value(q['p50'], 's/token')}, "
                     f"p99 {_value(q['p99'], 's/token')}")
    for kind in ("critical", "other"):
        m = t["mean_s"][kind]
        lines.append(f"mean seconds, {kind} groups: " + ", ".join(f"{p[:-2]} {_value(m[p], 's')}" for p in PHASES))
    lines += _episode_lines(t.get("episodes"))
    lines.append(verdict(t))
    return "\n".join(lines)


def _episode_lines(e: Mapping[str, Any] | None) -> list[str]:
    """The multi-turn section (tail's `episodes`): where episodes' time goes; none without it."""
    if not e:
        return []
    faults = ", ".join(f"{n} {kind}" for kind, n in e["faults"].items()) or "none"
    q = e["turns_per_episode"]
    lines = [f"episodes: {e['episodes']} ({e['turns']} model turns, p50 {q['p50']:.3g} / p95 {q['p95']:.3g} "
             f"turns each; ended by an environment fault: {faults})"]
    for part in EPISODE_PARTS:
        share, turn = e["share"][part], e["per_turn_s"][part]
        lines.append(f"episode time {part}: {_value(e['total_s'][part], 's')} ({_value(share, '%')}); per turn "
                     f"p50 {_value(turn['p50'], 's')}, p95 {_value(turn['p95'], 's')}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = entry.ArgumentParser(prog="python -m planner.tail",
                                  description="Where the tail's time goes (docs/tail_analysis.md).")
    parser.add_argument("run_dir", help="a run directory: a training run's (trace.jsonl) or a simulated one's")
    parser.add_argument("--json", action="store_true", help="print the tail dict as JSON")
    args = parser.parse_args(argv)
    run_dir = Path(args.run_dir)
    try:
        if (run_dir / TRACE_FILE).is_file():
            t = from_run_dir(run_dir)
        elif (run_dir / SUMMARY_FILE).is_file() and "tail" in json.loads((run_dir / SUMMARY_FILE).read_text()):
            t = json.loads((run_dir / SUMMARY_FILE).read_text())["tail"]  # a simulated run: computed by the simulator
        else:
            raise ValueError(f"{run_dir}: neither a {TRACE_FILE} nor a {SUMMARY_FILE} with `tail` (is it a run directory?)")
    except ValueError as e:
        entry.fail(e)
    print(json.dumps(t, indent=2) if args.json else report(t))
    return 0
