"""Independent audit of a run: recompute every staleness claim from `ledger.jsonl` alone.

    python -m planner.audit RUN_DIR [--max-staleness η] [--json]

It trusts nothing the run computed: staleness comes from the `train` events (train step −
token version), losses from admits that never reach a `train` or `drop`. Exit status 1 when a
trained token is staler than η, a group is lost, a group is trained twice (or trained after a
drop), a token's version is older than its group's admission version or newer than the step
that trained it, or the ledger is malformed. η defaults to `max_staleness` in the run's
summary.json; with neither, only the structural checks apply.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

from planner.ledger import LEDGER_FILE, LedgerError, read_ledger


@dataclass
class AuditReport:
    max_staleness: int | None
    steps: int = 0
    groups_admitted: int = 0
    groups_trained: int = 0
    groups_dropped: int = 0
    readmissions: int = 0
    moves: int = 0
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

    @property
    def ok(self) -> bool:
        return not (self.violations or self.lost or self.trained_twice or self.errors)

    def verdict(self) -> str:
        eta = "unbounded" if self.max_staleness is None else f"η={self.max_staleness}"
        head = "PASS" if self.ok else "FAIL"
        text = (
            f"audit {head}: {self.steps} steps, {self.groups_trained} groups trained, "
            f"max staleness {self.max_token_staleness} ({eta}), {self.violations} violations, "
            f"{self.groups_dropped} dropped, {len(self.lost)} lost, {len(self.trained_twice)} trained twice"
        )
        if self.errors:
            text += f"; {len(self.errors)} ledger errors, first: {self.errors[0]}"
        return text


def audit(run_dir: str | Path, max_staleness: int | None = None) -> AuditReport:
    """Recompute the run's staleness facts from its ledger. Raises LedgerError / FileNotFoundError."""
    run_dir = Path(run_dir)
    ledger = run_dir / LEDGER_FILE if run_dir.is_dir() else run_dir
    if not ledger.exists():
        raise FileNotFoundError(f"{ledger}: no ledger (expected {LEDGER_FILE} in the run directory)")
    if max_staleness is None:
        summary = ledger.parent / "summary.json"
        if summary.exists():
            max_staleness = json.loads(summary.read_text()).get("max_staleness")
    report = AuditReport(max_staleness=max_staleness)
    admitted: dict[int, int] = {}  # uid -> admission version (open groups)
    closed: dict[int, str] = {}  # uid -> "trained" | "dropped"
    hist: Counter[int] = Counter()
    steps_seen: set[int] = set()

    for ev in read_ledger(ledger):
        kind, line = ev["event"], ev["_line"]
        try:
            if kind == "admit":
                uid = int(ev["uid"])
                if uid in closed:
                    report.errors.append(f"line {line}: uid {uid} admitted after it was {closed[uid]}")
                elif uid in admitted:
                    report.readmissions += 1
                else:
                    report.groups_admitted += 1
                admitted[uid] = int(ev["version"])
            elif kind == "train":
                step = int(ev["step"])
                if step in steps_seen:
                    report.errors.append(f"line {line}: step {step} trained twice")
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
                    worst = 0
                    for v, tokens in grp["versions"]:
                        v, tokens = int(v), int(tokens)
                        if v > step:
                            report.errors.append(f"line {line}: uid {uid} has tokens of version {v} > step {step}")
                        if v < a:
                            report.errors.append(f"line {line}: uid {uid} has tokens of version {v} < admission {a}")
                        s = step - v
                        hist[s] += tokens
                        report.tokens_trained += tokens
                        if tokens:
                            worst = max(worst, s)
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
                report.tokens_wasted += int(ev.get("tokens", 0))
                reason = str(ev.get("reason", ""))
                report.drops_by_reason[reason] = report.drops_by_reason.get(reason, 0) + 1
            elif kind == "move":
                int(ev["uid"]), int(ev["from"]), int(ev["to"])
                report.moves += 1
            elif kind == "start":
                int(ev["uid"]), int(ev["version"])
            else:
                report.errors.append(f"line {line}: unknown event '{kind}'")
        except (KeyError, TypeError, ValueError) as e:
            raise LedgerError(f"{ledger}:{line}: bad '{kind}' event ({type(e).__name__}: {e})") from None

    report.lost = sorted(admitted)
    report.steps = len(steps_seen)
    report.staleness_histogram = {str(s): hist[s] for s in sorted(hist)}
    if report.tokens_trained:
        report.max_token_staleness = max(s for s, t in hist.items() if t)
        report.mean_token_staleness = sum(s * t for s, t in hist.items()) / report.tokens_trained
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m planner.audit", description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", help="run directory holding ledger.jsonl (or the ledger file itself)")
    parser.add_argument("--max-staleness", type=int, default=None, help="η to check (default: summary.json's)")
    parser.add_argument("--json", action="store_true", help="print the full report as JSON")
    args = parser.parse_args(argv)
    if args.max_staleness is not None and args.max_staleness < 0:
        print(f"error: --max-staleness={args.max_staleness}: must be >= 0", file=sys.stderr)
        return 2
    try:
        report = audit(args.run_dir, args.max_staleness)
    except (LedgerError, FileNotFoundError, json.JSONDecodeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps({**asdict(report), "ok": report.ok}, indent=1))
    print(report.verdict())
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
