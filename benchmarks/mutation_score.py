"""Score one module's mutmut run: `python benchmarks/mutation_score.py MODULE RESULTS GLOB...`.

RESULTS is the output of `mutmut results --all true` (one `name: status` a line); only mutants
whose names match a GLOB count (benchmarks/mutation.sh passes the functions it ran). Killed =
killed + timeout + segfault (the test run failed); every other checked status (survived, no tests,
suspicious) is a survivor, listed by name for `mutmut show NAME`. Prints one line of counts, the
survivors, and exits 0 (the score is a report, not a gate).
"""

from __future__ import annotations

import sys
from collections import Counter
from fnmatch import fnmatchcase

KILLED = {"killed", "timeout", "segfault", "caught by type check"}
UNCHECKED = {"not checked", "skipped", "check was interrupted by user"}


def main(argv: list[str]) -> int:
    if len(argv) < 3:
        print(__doc__.splitlines()[0], file=sys.stderr)
        return 2
    module, results, globs = argv[0], argv[1], argv[2:]
    statuses: dict[str, str] = {}
    with open(results, encoding="utf-8") as fh:
        for line in fh:
            name, sep, status = line.strip().rpartition(": ")
            if sep and any(fnmatchcase(name, g) for g in globs):
                statuses[name] = status
    counts = Counter(statuses.values())
    checked = {n: s for n, s in statuses.items() if s not in UNCHECKED}
    killed = sum(s in KILLED for s in checked.values())
    survivors = sorted(n for n, s in checked.items() if s not in KILLED)
    score = 100.0 * killed / len(checked) if checked else 0.0
    print(f"{module}: {killed}/{len(checked)} killed ({score:.1f}%); " + ", ".join(f"{s} {c}" for s, c in sorted(counts.items())))
    for name in survivors:
        print(f"  survived: {name} ({statuses[name]})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
