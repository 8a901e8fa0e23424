"""`python -m planner.audit RUN_DIR [--max-staleness η] [--max-length-bias X] [--json]`: audit a run.

Independent audit of a run: recompute every staleness claim from `ledger.jsonl` alone (the rules:
planner/ledger_audit.py, docs/design.md §8.2). Prints the verdict line; exit status 1 when the
audit fails (or the ledger cannot be read), 2 on a bad option. `--json` prints one JSON object
(the report, `ok` and the verdict line) and nothing else, so that it pipes into jq.
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict

from planner.ledger import LedgerError
from planner.ledger_audit import audit
from planner.tools import entry

DESCRIPTION = "Independent audit of a run: recompute every staleness claim from `ledger.jsonl` alone."


def main(argv: list[str] | None = None) -> int:
    parser = entry.ArgumentParser(prog="python -m planner.audit", description=DESCRIPTION)
    parser.add_argument("run_dir", help="run directory holding ledger.jsonl (or the ledger file itself)")
    parser.add_argument("--max-staleness", type=int, help="η to check (default: summary.json's)")
    parser.add_argument("--max-length-bias", type=float,
                        help="fail when the KS statistic of admitted vs trained group lengths exceeds this")
    parser.add_argument("--json", action="store_true", help="print the full report as JSON")
    args = parser.parse_args(argv)
    if args.max_staleness is not None and args.max_staleness < 0:
        print(f"error: --max-staleness={args.max_staleness}: must be >= 0", file=sys.stderr)
        return 2
    if args.max_length_bias is not None and not 0 <= args.max_length_bias <= 1:
        print(f"error: --max-length-bias={args.max_length_bias}: must be in [0, 1] (a KS statistic)", file=sys.stderr)
        return 2
    try:
        report = audit(args.run_dir, args.max_staleness, max_length_bias=args.max_length_bias)
    except (LedgerError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    if args.json:  # one JSON object and nothing else, so that it pipes into jq
        print(json.dumps({**asdict(report), "ok": report.ok, "verdict": report.verdict()}, indent=1))
    else:
        print(report.verdict())
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
