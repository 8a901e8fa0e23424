"""Prefixes packed into prefill rows (packing.py)."""

import numpy as np

from jaxrl_async.engines.jax.config import EngineConfig
from jaxrl_async.engines.jax.packing import packed_rows

CONFIG = EngineConfig(num_slots=4, max_len=16, min_bucket=4)


def test_prefixes_pack_in_order_into_rows_of_at_most_max_len_each_padded_to_its_bucket():
    rows = packed_rows([([1, 2, 3], 2), ([4] * 10, 0), ([9] * 4, 3), ([5, 6], 1)], CONFIG)
    assert [(r.prefixes, r.length, r.tokens.shape[1]) for r in rows] == [(2, 13, 16), (2, 6, 8)]
    first, second = rows
    assert first.tokens[0].tolist() == [1, 2, 3] + [4] * 10 + [0] * 3
    assert first.positions[0].tolist() == [0, 1, 2] + list(range(10)) + [0] * 3
    assert first.segments[0].tolist() == [0] * 3 + [1] * 10 + [-1] * 3
    assert first.slots.tolist() == [2] * 3 + [0] * 10 + [-1] * 3
    assert second.slots.tolist() == [3] * 4 + [1] * 2 + [-1] * 2 and second.segments[0, 4] == 1
    assert all(r.tokens.dtype == r.positions.dtype == r.segments.dtype == r.slots.dtype == np.int32 for r in rows)


def test_no_prefixes_make_no_rows():
    assert packed_rows([], CONFIG) == []
