"""Which fields a config dataclass documents: the names of its docstring's `Attributes:` section."""

from __future__ import annotations

import dataclasses
import inspect
import re


def undocumented_fields(cls: type) -> list[str]:
    """The init fields of `cls` that its own docstring's Google-style `Attributes:` section does not
    name (`    name: text` at the section's first indentation; deeper lines continue an entry)."""
    doc = inspect.cleandoc(cls.__doc__ or "")
    section = doc.split("Attributes:", 1)[1] if "Attributes:" in doc else ""
    named = set(re.findall(r"^    (\w+):", section, re.MULTILINE))
    return [f.name for f in dataclasses.fields(cls) if f.init and f.name not in named]
