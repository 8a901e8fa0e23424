"""planner.versions: run-length token versions and staleness counts."""

import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from planner import versions


def test_append_merges_a_run_on_the_same_version_and_starts_one_on_another():
    runs: versions.VersionRuns = []
    for version, tokens in [(0, 2), (0, 3), (1, 1), (0, 1), (0, 4)]:
        versions.append_run(runs, version, tokens)
    assert runs == [[0, 5], [1, 1], [0, 5]]


def test_joined_pieces_merge_at_the_seam_and_never_alias_the_pieces():
    pieces = [[[0, 2]], [[0, 1], [1, 3]], [], [[1, 2], [2, 1]]]
    runs = versions.join_runs(pieces)
    assert runs == [[0, 3], [1, 5], [2, 1]]
    runs[0][1] = 99
    assert pieces[0] == [[0, 2]]


@given(st.lists(st.integers(0, 4), max_size=60))
def test_encoding_per_token_versions_round_trips_with_no_adjacent_equal_runs(per_token):
    runs = versions.encode_runs(per_token)
    assert versions.decode_runs(runs) == per_token
    assert all(a[0] != b[0] for a, b in zip(runs, runs[1:])) and all(t > 0 for _, t in runs)
    assert versions.join_runs([versions.encode_runs(per_token[:7]), versions.encode_runs(per_token[7:])]) == runs


def test_tokens_by_version_sum_over_samples_oldest_first_and_staleness_counts_tokens():
    counts = versions.tokens_by_version([[[2, 3], [3, 1]], [[1, 2]], [[3, 4]]])
    assert counts == [(1, 2), (2, 3), (3, 5)]
    hist: dict[int, int] = {}
    versions.add_staleness(hist, 3, counts)
    assert hist == {2: 2, 1: 3, 0: 5}
    assert versions.staleness_max(hist) == 2 and versions.staleness_mean(hist) == pytest.approx((4 + 3) / 10)
    assert versions.staleness_max({}) == 0 and versions.staleness_mean({}) == 0.0


def test_the_versions_module_imports_neither_jax_nor_asyncio_nor_the_runtime():
    """The engines import it for the version runs; it stays pure and light."""
    code = ("import sys, planner.versions; "
            "print(sorted(m for m in ('jax', 'asyncio', 'jaxrl_async', 'numpy') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
