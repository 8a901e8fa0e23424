"""A policy that asks for migrations, to drive the runtime's tail hooks before a real policy does."""

from __future__ import annotations

import dataclasses
from typing import Any


class MigrateOnFirstTokens:
    """Any policy, plus each group named once in `Decision.migrate` at its first `on_tokens`
    event (the group is running and has a prefix by then). Everything else is the inner policy's,
    so the bound is the inner policy's: a migration never changes a decision about versions."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.named: list[int] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def on_tokens(self, *, uid: int, version: int, tokens: int, now: float):
        d = self.inner.on_tokens(uid=uid, version=version, tokens=tokens, now=now)
        if uid in self.named:
            return d
        self.named.append(uid)
        return dataclasses.replace(d, migrate=[*d.migrate, uid])
