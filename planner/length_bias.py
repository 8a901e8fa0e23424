"""The length-bias certificate (docs/design.md §8.2): did the run train what it admitted?

A policy that drops stale groups drops the slow ones, and the slow ones are the long ones, so
the groups it trains are shorter than the groups it admitted: training is biased toward short
completions. A no-drop policy trains every admitted group, so the two samples are the same. This
module compares the two samples of per-group completion lengths (total response tokens of a
group's n samples) with two numbers:

- `ks`: the two-sample Kolmogorov–Smirnov statistic sup_x |F_admitted(x) − F_trained(x)|, in
  [0, 1]; 0 when the samples have the same distribution (in particular when nothing was dropped).
- `mean_length_ratio`: mean trained length / mean admitted length; below 1 when training favours
  short completions.

Both are None when either sample is empty. The statistic is computed here with numpy (planner/
takes no scipy); tests compare it with `scipy.stats.ks_2samp`. Who builds the samples: the audit
from the ledger (`planner.audit`), the simulator from the workload's true lengths
(`planner.sim.metrics`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def ks_statistic(a: Sequence[float], b: Sequence[float]) -> float:
    """Two-sample KS statistic of `a` and `b` (both non-empty): the largest gap between their
    empirical CDFs, evaluated at every observed value (where the step functions jump)."""
    xa, xb = np.sort(np.asarray(a, dtype=np.float64)), np.sort(np.asarray(b, dtype=np.float64))
    if not len(xa) or not len(xb):
        raise ValueError(f"ks_statistic: both samples must be non-empty, got {len(xa)} and {len(xb)} values")
    grid = np.concatenate([xa, xb])
    cdf_a = np.searchsorted(xa, grid, side="right") / len(xa)
    cdf_b = np.searchsorted(xb, grid, side="right") / len(xb)
    return float(np.max(np.abs(cdf_a - cdf_b)))


def length_bias(admitted: Sequence[int], trained: Sequence[int]) -> dict[str, float | None]:
    """`{"ks": .., "mean_length_ratio": ..}` of the admitted groups' lengths vs the trained ones'."""
    if not len(admitted) or not len(trained):
        return {"ks": None, "mean_length_ratio": None}
    mean_admitted = float(np.mean(admitted))
    ratio = float(np.mean(trained)) / mean_admitted if mean_admitted else 1.0
    return {"ks": ks_statistic(admitted, trained), "mean_length_ratio": ratio}
