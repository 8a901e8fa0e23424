"""Prompts packed into prefill rows: the one routine every prefill of the JAX engine goes through.

A core prefills token prefixes (a new prompt but its last token; a migrated sample's prompt and
prefix; each into one slot) several to a row: in order, as many as fit in `max_len` tokens, each
at positions 0, 1, ... of its own segment (the prefill step's segment mask keeps them apart),
the row padded to the smallest bucket (compiles.bucket) that holds it. `EngineCore.prefill` makes
one prefill call per row; the contiguous core writes a row into its slots' cache rows, the paged
core into its slots' pages.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from jaxrl_async.engines.jax.compiles import bucket
from jaxrl_async.engines.jax.config import EngineConfig


@dataclass(frozen=True)
class PackedRow:
    """One prefill call's input: prefixes packed into one row of a bucket's length B."""

    tokens: np.ndarray  # [1, B] int32; padding 0
    positions: np.ndarray  # [1, B] int32: each token's position in its own prefix; padding 0
    segments: np.ndarray  # [1, B] int32: the index of the token's prefix in the row; padding -1
    slots: np.ndarray  # [B] int32: the slot the token's prefix is prefilled into; padding -1
    prefixes: int  # prefixes in the row
    length: int  # tokens in the row, padding excluded


def packed_rows(prefixes: Sequence[tuple[Sequence[int], int]], config: EngineConfig) -> list[PackedRow]:
    """(prefix tokens, slot) pairs, in order, packed into rows of at most `max_len` tokens."""
    groups: list[list[tuple[Sequence[int], int]]] = []
    total = config.max_len
    for prefix, slot in prefixes:
        if total + len(prefix) > config.max_len:
            groups.append([])
            total = 0
        groups[-1].append((prefix, slot))
        total += len(prefix)
    return [_row(group, config) for group in groups]


def _row(group: list[tuple[Sequence[int], int]], config: EngineConfig) -> PackedRow:
    width = bucket(config, sum(len(prefix) for prefix, _ in group))
    tokens, positions = np.zeros((1, width), np.int32), np.zeros((1, width), np.int32)
    segments, slots = np.full((1, width), -1, np.int32), np.full(width, -1, np.int32)
    offset = 0
    for i, (prefix, slot) in enumerate(group):
        end = offset + len(prefix)
        tokens[0, offset:end], positions[0, offset:end] = prefix, np.arange(len(prefix))
        segments[0, offset:end], slots[offset:end] = i, slot
        offset = end
    return PackedRow(tokens, positions, segments, slots, len(group), offset)
