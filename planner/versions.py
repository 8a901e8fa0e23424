"""Token versions: the weight version of every sampled token, run-length encoded, and staleness.

`VersionRuns` is `[[version, tokens], ...]` in sampling order, adjacent runs on different
versions — what the engines stream (`jaxrl_async.engines`), the runtime's rollouts keep and the
ledger's `versions` sum up. `append_run`, `extend_runs`, `join_runs`, `encode_runs` /
`decode_runs` build and read runs; `tokens_by_version` counts a group's tokens by version (the
ledger's and `Policy.on_group_finished`'s `versions`). The staleness helpers count trained tokens
by staleness (step − generation version): `add_staleness`, `staleness_max`, `staleness_mean`.

These live apart from `planner.driver` because the engines count tokens by version without
being drivers; the module imports nothing but `planner.types`, so the engines stay light.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from planner.types import Versions

VersionRuns = list[list[int]]  # [[version, tokens], ...] in sampling order


def append_run(runs: VersionRuns, version: int, tokens: int = 1) -> None:
    """`tokens` more tokens sampled on `version`, at the end of `runs` (merged into its last run
    when that run has the same version). A new run is a new list: `runs` never aliases a caller's."""
    if runs and runs[-1][0] == version:
        runs[-1][1] += tokens
    else:
        runs.append([version, tokens])


def extend_runs(runs: VersionRuns, more: Iterable[Sequence[int]]) -> None:
    """Append the runs `more` (e.g. a streamed piece's) to `runs`, merging at the seam."""
    for version, tokens in more:
        append_run(runs, version, tokens)


def join_runs(pieces: Iterable[Iterable[Sequence[int]]]) -> VersionRuns:
    """The runs of consecutive pieces of one sample, as one list."""
    runs: VersionRuns = []
    for piece in pieces:
        extend_runs(runs, piece)
    return runs


def encode_runs(versions: Iterable[int]) -> VersionRuns:
    """Per-token versions -> runs."""
    runs: VersionRuns = []
    for version in versions:
        append_run(runs, version)
    return runs


def decode_runs(runs: Iterable[Sequence[int]]) -> list[int]:
    """Runs -> per-token versions."""
    return [version for version, tokens in runs for _ in range(tokens)]


def tokens_by_version(samples: Iterable[Iterable[Sequence[int]]]) -> Versions:
    """Tokens by version over the runs of several samples, oldest version first (a group's
    ledger `versions`, `Policy.on_group_finished`'s `versions`)."""
    counts: dict[int, int] = {}
    for runs in samples:
        for version, tokens in runs:
            counts[version] = counts.get(version, 0) + tokens
    return sorted(counts.items())


def add_staleness(hist: dict[int, int], step: int, versions: Iterable[Sequence[int]]) -> None:
    """Count tokens trained at `step` into `hist` by staleness (step − generation version)."""
    for version, tokens in versions:
        hist[step - version] = hist.get(step - version, 0) + tokens


def staleness_max(hist: Mapping[int, int]) -> int:
    """The largest staleness that has tokens (0 for an empty histogram)."""
    return max((s for s, t in hist.items() if t), default=0)


def staleness_mean(hist: Mapping[int, int]) -> float:
    """Token-weighted mean staleness (0.0 for an empty histogram)."""
    total = sum(hist.values())
    return sum(s * t for s, t in hist.items()) / total if total else 0.0
