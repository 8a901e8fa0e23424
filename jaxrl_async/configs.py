"""Typed configs from composed Hydra dicts: one checked constructor for every frozen dataclass.

Each config section (`trainer.optim`, `engine`, `cluster.distributed`, ...) is a frozen dataclass
whose `__post_init__` validates values; `build_dataclass` adds the two checks a dataclass cannot
make itself — an unknown key and a missing required key — as one-line errors naming the section.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, TypeVar

T = TypeVar("T")


def build_dataclass(cls: type[T], values: Mapping[str, Any], where: str) -> T:
    """`cls(**values)`; an unknown or missing key is a one-line ValueError naming `where`."""
    fields = dataclasses.fields(cls)
    known = sorted(f.name for f in fields)
    unknown = sorted(set(values) - set(known))
    if unknown:
        raise ValueError(f"{where}: unknown keys {unknown}; known keys are {known}")
    missing = [f.name for f in fields if f.default is dataclasses.MISSING
               and f.default_factory is dataclasses.MISSING and f.name not in values]
    if missing:
        raise ValueError(f"{where}.{missing[0]}: missing key")
    return cls(**values)
