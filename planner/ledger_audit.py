"""The audit's rules: recompute every staleness claim of a run from its `ledger.jsonl` alone.

    audit(run_dir[, max_staleness][, max_length_bias=X]) -> AuditReport   (.ok, .verdict())

It trusts nothing the run computed: staleness comes from the `train` events (train step −
token version), losses from admits that never reach a `train` or `drop`. A report is not ok when a
trained token is staler than η, a group is lost, a group is trained twice (or trained after a
drop), a token's version is older than its group's admission version or newer than the step
that trained it, the ledger is malformed, empty, or stops short of the run's metrics.jsonl /
summary.json, a `migrate` line names a group that is not open, a group's trained (or dropped)
tokens do not contain the prefix a `migrate` line moved, version for version (a move lost or
re-versioned tokens), a multi-turn group's `turns` spans do not add up, version for version, to
its `versions`, hold a negative count, or, within one sample, go back to an older version than
the turn before (a later turn sampled on older weights), or (with max_length_bias) the length-bias KS statistic exceeds it. η defaults
to the run's summary.json: its `staleness_bound` (the policy's own claim, looser than
`max_staleness` for torchtitan's windowed FIFO) or else its `max_staleness`; with neither, only
the structural checks apply.

The rules are the ledger contract's other half (planner/ledger.py writes, this reads), so they sit
beside it; every reader shares them — the command `python -m planner.audit` (planner/tools/audit.py),
the training run's summary (jaxrl_async/job/report.py) and the tests. docs/design.md §8.2 lists the
rules; tests/planner/test_ledger_audit.py holds a failing ledger for each.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from planner.ledger import LEDGER_FILE, LedgerError, read_ledger
from planner.run_files import METRICS_FILE, SUMMARY_FILE
from planner.length_bias import length_bias


@dataclass
class AuditReport:
    max_staleness: int | None
    max_length_bias: float | None = None  # the KS statistic above which the audit fails; None: not checked
    steps: int = 0
    groups_admitted: int = 0
    groups_trained: int = 0
    groups_dropped: int = 0
    readmissions: int = 0
    moves: int = 0
    migrations: int = 0  # `migrate` lines: running groups moved to another replica, prefix kept
    episodes: int = 0  # samples of trained multi-turn groups (those with `turns` spans) audited
    turns: int = 0  # their model turns audited
    tokens_trained: int = 0
    tokens_wasted: int = 0
    max_token_staleness: int = 0
    mean_token_staleness: float = 0.0
    staleness_histogram: dict[str, int] = field(default_factory=dict)
    violations: int = 0  # groups with a token staler than η
    lost: list[int] = field(default_factory=list)
    trained_twice: list[int] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # structural: unknown uid, future token, ...
    drops_by_reason: dict[str, int] = field(default_factory=dict)
    length_bias: dict[str, float | None] = field(default_factory=lambda: length_bias([], []))

    @property
    def length_bias_exceeded(self) -> bool:
        ks = self.length_bias["ks"]
        return self.max_length_bias is not None and ks is not None and ks > self.max_length_bias

    @property
    def ok(self) -> bool:
        return not (self.violations or self.lost or self.trained_twice or self.errors or self.length_bias_exceeded)

    def verdict(self) -> str:
        eta = "unbounded" if self.max_staleness is None else f"η={self.max_staleness}"
        head = "PASS" if self.ok else "FAIL"
        text = (
            f"audit {head}: {self.steps} steps, {self.groups_trained} groups trained, "
            f"max staleness {self.max_token_staleness} ({eta}), {self.violations} violations, "
            f"{self.groups_dropped} dropped, {len(self.lost)} lost, {len(self.trained_twice)} trained twice"
        )
        if self.episodes:
            text += f", {self.episodes} episodes ({self.turns} turns) checked turn by turn"
        ks, ratio = self.length_bias["ks"], self.length_bias["mean_length_ratio"]
        if ks is not None:
            text += f", length bias KS {ks:.3f} (trained/admitted mean length {ratio:.3f})"
            if self.length_bias_exceeded:
                text += f" > {self.max_length_bias}"
        if self.errors:
            text += f"; {len(self.errors)} ledger errors, first: {self.errors[0]}"
        return text


def audited_bound(max_staleness: int | None, staleness_bound: int | None) -> int | None:
    """The staleness a run is checked against by default: its policy's own claim when it makes one
    (η for a strict policy; S + ⌈(W−1)/P⌉ for torchtitan's windowed FIFO, looser than η), else η,
    so that a policy that bounds nothing is still shown where it exceeds the η it was given."""
    return max_staleness if staleness_bound is None else staleness_bound


def audit(run_dir: str | Path, max_staleness: int | None = None, *,
          max_length_bias: float | None = None) -> AuditReport:
    """Recompute the run's staleness facts from its ledger. Raises LedgerError / FileNotFoundError."""
    run_dir = Path(run_dir)
    ledger = run_dir / LEDGER_FILE if run_dir.is_dir() else run_dir
    if not ledger.exists():
        raise FileNotFoundError(f"{ledger}: no ledger (expected {LEDGER_FILE} in the run directory)")
    summary = _read_summary(ledger.parent / SUMMARY_FILE)
    if max_staleness is None:
        max_staleness = audited_bound(summary.get("max_staleness"), summary.get("staleness_bound"))
    report = AuditReport(max_staleness=max_staleness, max_length_bias=max_length_bias)
    admitted: dict[int, int] = {}  # uid -> latest admission version (open groups)
    closed: dict[int, str] = {}  # uid -> "trained" | "dropped"
    lengths: dict[int, int] = {}  # uid -> completion length (trained tokens; a drop's length/tokens)
    trained_lengths: list[int] = []
    hist: Counter[int] = Counter()
    steps_seen: set[int] = set()
    events = 0
    # uid -> (version -> tokens the group's migrations moved, line of the latest): since its latest
    # admission (a re-admission may regenerate, discarding the prefix legitimately).
    prefixes: dict[int, tuple[Counter[int], int]] = {}

    for ev in read_ledger(ledger):
        kind, line = ev["event"], ev["_line"]
        events += 1
        try:
            if kind == "admit":
                uid = int(ev["uid"])
                if uid in closed:
                    report.errors.append(f"line {line}: uid {uid} admitted after it was {closed[uid]}")
                    continue  # the error is the finding; the group stays closed
                if uid in admitted:
                    report.readmissions += 1
                else:
                    report.groups_admitted += 1
                admitted[uid] = int(ev["version"])
                prefixes.pop(uid, None)
            elif kind == "train":
                step = int(ev["step"])
                if step in steps_seen:
                    report.errors.append(f"line {line}: step {step} trained twice")
                elif step != len(steps_seen):
                    report.errors.append(f"line {line}: step {step} follows {len(steps_seen)} trained steps "
                                         f"(steps run 0, 1, 2, ... without a gap)")
                steps_seen.add(step)
                for grp in ev["groups"]:
                    uid = int(grp["uid"])
                    if closed.get(uid) == "trained":
                        report.trained_twice.append(uid)
                        continue
                    if uid not in admitted:
                        report.errors.append(f"line {line}: uid {uid} trained but never admitted (or after a drop)")
                        continue
                    a = admitted.pop(uid)
                    closed[uid] = "trained"
                    report.groups_trained += 1
                    lacking = _lacking(prefixes.pop(uid, None), grp["versions"])
                    if lacking:
                        report.errors.append(f"line {line}: uid {uid} trained without the prefix a migration moved: "
                                             f"{lacking} (a move lost or re-versioned tokens)")
                    if "turns" in grp:
                        report.errors += _turn_errors(line, uid, grp["versions"], grp["turns"], report)
                    worst = total = 0
                    for v, tokens in grp["versions"]:
                        v, tokens = int(v), int(tokens)
                        if tokens < 0:
                            report.errors.append(f"line {line}: uid {uid} has {tokens} tokens of version {v} (< 0)")
                        if v > step:
                            report.errors.append(f"line {line}: uid {uid} has tokens of version {v} > step {step}")
                        if v < a:
                            report.errors.append(f"line {line}: uid {uid} has tokens of version {v} < admission {a}")
                        s = step - v
                        hist[s] += tokens
                        total += tokens
                        if tokens:
                            worst = max(worst, s)
                    report.tokens_trained += total
                    lengths[uid] = total
                    trained_lengths.append(total)
                    if max_staleness is not None and worst > max_staleness:
                        report.violations += 1
            elif kind == "drop":
                uid = int(ev["uid"])
                if uid not in admitted:
                    report.errors.append(f"line {line}: uid {uid} dropped but not open")
                    continue
                admitted.pop(uid)
                closed[uid] = "dropped"
                report.groups_dropped += 1
                tokens = int(ev.get("tokens", 0))
                moved = prefixes.pop(uid, None)
                if moved is not None and "tokens" in ev and tokens < sum(moved[0].values()):
                    report.errors.append(f"line {line}: uid {uid} dropped with {tokens} tokens, fewer than the "
                                         f"{sum(moved[0].values())} its migration (line {moved[1]}) moved")
                report.tokens_wasted += tokens
                # A drop's completion length: the true length when the driver knows it (the
                # simulator's `length`), else at least what it generated.
                lengths[uid] = int(ev["length"]) if ev.get("length") is not None else tokens
                reason = str(ev.get("reason", ""))
                report.drops_by_reason[reason] = report.drops_by_reason.get(reason, 0) + 1
            elif kind == "move":
                int(ev["uid"]), int(ev["from"]), int(ev["to"])
                report.moves += 1
            elif kind == "start":
                int(ev["uid"]), int(ev["version"])
            elif kind == "migrate":
                uid = int(ev["uid"])
                int(ev["from"]), int(ev["to"])
                versions = [(int(v), int(t)) for v, t in ev["versions"]]
                report.migrations += 1
                if uid not in admitted:
                    report.errors.append(f"line {line}: uid {uid} migrated but not open "
                                         f"({closed.get(uid, 'never admitted')})")
                    continue
                lacking = _lacking(prefixes.get(uid), versions)
                if lacking:
                    report.errors.append(f"line {line}: uid {uid} migrated without the prefix its earlier migration "
                                         f"moved: {lacking}")
                prefixes[uid] = (Counter(dict(versions)) | prefixes.get(uid, (Counter(), 0))[0], line)
            else:
                report.errors.append(f"line {line}: unknown event '{kind}'")
        except (KeyError, TypeError, ValueError) as e:
            raise LedgerError(f"{ledger}:{line}: bad '{kind}' event ({type(e).__name__}: {e})") from None

    report.lost = sorted(admitted)
    for uid in report.lost:  # not trained: like a drop that generated nothing the ledger knows of
        lengths[uid] = 0
    report.steps = len(steps_seen)
    report.errors += _completeness(ledger, events, steps_seen, summary)
    report.length_bias = length_bias(list(lengths.values()), trained_lengths)
    report.staleness_histogram = {str(s): hist[s] for s in sorted(hist)}
    if report.tokens_trained:
        report.max_token_staleness = max(s for s, t in hist.items() if t)
        report.mean_token_staleness = sum(s * t for s, t in hist.items()) / report.tokens_trained
    return report


def _turn_errors(line: int, uid: int, versions: Any, turns: Any, report: AuditReport) -> list[str]:
    """The findings on a trained group's per-turn spans (`turns`: [[sample, [[v, tokens], ...]],
    ...], in turn order within each sample): counts >= 0; within a sample, the turns' versions read
    in order never decrease (a later turn never samples on older weights); summed over all turns,
    tokens per version equal the group's `versions`. Counts the episodes and turns on `report`."""
    errors: list[str] = []
    summed: Counter[int] = Counter()
    newest: dict[int, int] = {}  # sample -> newest version its turns so far sampled on
    for sample, span in turns:
        sample = int(sample)
        report.turns += 1
        span = [(int(v), int(tokens)) for v, tokens in span]
        for v, tokens in span:
            if tokens < 0:
                errors.append(f"line {line}: uid {uid} sample {sample} has a turn with {tokens} tokens of "
                              f"version {v} (< 0)")
            summed[v] += tokens
        used = [v for v, tokens in span if tokens > 0]
        before = newest.get(sample)
        if used and before is not None and min(used) < before:
            errors.append(f"line {line}: uid {uid} sample {sample} has a turn on version {min(used)} after a turn "
                          f"on version {before} (a later turn sampled on older weights)")
        newest[sample] = max([*used, -1] if before is None else [*used, before])
    report.episodes += len(newest)
    group: Counter[int] = Counter()
    for v, tokens in versions:
        group[int(v)] += int(tokens)
    differ = [f"version {v}: turns {summed[v]} != group {group[v]}" for v in sorted(set(summed) | set(group))
              if summed[v] != group[v]]
    if differ:
        errors.append(f"line {line}: uid {uid} samples {', '.join(map(str, sorted(newest)))}: their turns do not "
                      f"add up to the group's versions: {', '.join(differ)}")
    return errors


def _lacking(moved: tuple[Counter[int], int] | None, versions: Any) -> str:
    """'' when `versions` ([[v, tokens], ...]) hold, per version, at least the tokens `moved`
    (the prefix of the group's migrations, and the line of the latest); else what is missing."""
    if moved is None:
        return ""
    have: Counter[int] = Counter()
    for v, t in versions:
        have[int(v)] += int(t)
    short = [f"version {v}: {have[v]} < {t}" for v, t in sorted(moved[0].items()) if have[v] < t]
    return f"{', '.join(short)} (migrate line {moved[1]})" if short else ""


def _read_summary(path: Path) -> dict[str, Any]:
    if not path.exists():
        return {}
    try:
        obj = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise LedgerError(f"{path}: not valid JSON ({e.msg}, line {e.lineno})") from None
    if not isinstance(obj, dict):
        raise LedgerError(f"{path}: expected a JSON object, got {type(obj).__name__}")
    return obj


def _metrics_steps(path: Path) -> tuple[set[int], list[str]]:
    """The `step` of every record of metrics.jsonl, and an error per unreadable line."""
    steps: set[int] = set()
    errors: list[str] = []
    if not path.exists():
        return steps, errors
    with open(path, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                steps.add(int(json.loads(line)["step"]))
            except (json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
                errors.append(f"{path}:{lineno}: unreadable metrics record ({type(e).__name__}: {e})")
    return steps, errors


def _completeness(ledger: Path, events: int, trained: set[int], summary: dict[str, Any]) -> list[str]:
    """A ledger proves only what it holds: an empty one, or one whose trained steps stop short of
    what metrics.jsonl and summary.json say was trained (a crash lost its tail), fails."""
    if not events:
        return [f"{ledger}: the ledger is empty (no events): nothing proves what the run trained"]
    metrics = ledger.parent / METRICS_FILE
    metric_steps, errors = _metrics_steps(metrics)
    claimed = summary.get("steps")
    claimed = claimed if isinstance(claimed, int) and not isinstance(claimed, bool) else 0
    if not trained and (metric_steps or claimed > 0):
        said = max(len(metric_steps), claimed)
        return errors + [f"{ledger}: no train event, but {METRICS_FILE} / {SUMMARY_FILE} say {said} steps were trained"]
    missing = sorted(metric_steps - trained)
    if missing:
        shown = ", ".join(map(str, missing[:5])) + (", ..." if len(missing) > 5 else "")
        errors.append(f"{ledger}: stops short of {METRICS_FILE}: steps {shown} have a metrics record "
                      f"and no train event")
    if claimed > len(trained):
        errors.append(f"{ledger}: stops short of {SUMMARY_FILE}: it says {claimed} steps, the ledger trains "
                      f"{len(trained)}")
    return errors
