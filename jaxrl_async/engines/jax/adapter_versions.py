"""Version-pinned LoRA generation (`engine.adapter_versions=K > 1`, sync mode "pinned").

The engine keeps its base weights unmerged and up to K pushed adapters stacked in K entries
([K, *in, r] and [K, r, *out] per layer and projection: `ResidentAdapters`, models/lora.py). Each
sample is pinned at admission to the newest resident version and every token it samples uses
(and reports) that version until it ends, so a sequence never mixes versions and a push never
drains the engine. The layers add scale * (x A[v]) B[v] to x W per slot (models/lora.py
`adapter_output`).

A push takes the entry of the oldest resident version that no live sample is pinned to (an
empty entry first); when every entry is pinned, it waits and is installed at the first engine
iteration where one is free (`EngineCore.step`). The entry the engine was built with holds the
zero adapter: the base, the version-0 weights of a LoRA run (B starts at zero).

No jax.jit per instance: `put_entry` is jitted once at module level and donates the stack.
"""

from __future__ import annotations

from collections.abc import Iterable

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_async.models.lora import LoraAdapter, ResidentAdapters


def _put_entry(stack: tuple, adapter_layers: dict, entry: jax.Array) -> tuple:
    """`stack` (one dict per layer, leaves [K, ...]) with entry `entry` set to the stacked
    adapter's layer slices (leaves [L, ...]), cast to the stack's dtype."""
    return tuple(jax.tree.map(lambda s, x, i=i: s.at[entry].set(x[i].astype(s.dtype)), layer, adapter_layers)
                 for i, layer in enumerate(stack))


put_entry = jax.jit(_put_entry, donate_argnums=0)


class AdapterVersions:
    """The K entries: which version each holds, the device stack, what the pushes did."""

    def __init__(self, k: int, first: LoraAdapter, version: int, place) -> None:
        """Entries for `first`'s shapes and scale, entry 0 holding the zero adapter as `version`
        (the engine's weights so far: its base); `place` puts a new array where the base is."""
        num_layers = next(iter(first.params["layers"].values()))["a"].shape[0]
        self.scale = first.scale
        self.stack = tuple(
            jax.tree.map(lambda x: jax.device_put(jnp.zeros((k, *x.shape[1:]), x.dtype), place), first.params["layers"])
            for _ in range(num_layers))
        self.versions: list[int | None] = [version] + [None] * (k - 1)
        self.installed = 0  # pushes installed, none with a drain
        self.waited = 0  # pushes that found every entry pinned and waited for a slot to free

    @property
    def resident(self) -> list[int]:
        return sorted(v for v in self.versions if v is not None)

    def entry_of(self, version: int) -> int:
        return self.versions.index(version)

    def free_entry(self, pinned: Iterable[int]) -> int | None:
        """The entry a push may take: an empty one, else the oldest version no live sample is
        pinned to; None when every entry is pinned."""
        pinned = set(pinned)
        free = [(v is not None, -1 if v is None else v, e) for e, v in enumerate(self.versions) if v not in pinned]
        return min(free)[2] if free else None

    def install(self, entry: int, adapter: LoraAdapter, version: int) -> None:
        if adapter.scale != self.scale:
            raise ValueError(f"update_weights: adapter scale {adapter.scale} differs from the resident "
                             f"adapters' {self.scale} (trainer.lora.alpha / rank changed)")
        self.stack = put_entry(self.stack, adapter.params["layers"], np.int32(entry))
        self.versions[entry] = version
        self.installed += 1

    def weights(self, base: dict, slot_entry: np.ndarray) -> dict:
        """The step functions' weights: `base` with the resident adapters and each slot's entry."""
        return {**base, "adapters": ResidentAdapters(self.stack, slot_entry, self.scale)}

    def summary(self) -> dict:
        """What EngineStats and summary.json report: K, resident versions, push counts."""
        return {"versions": len(self.versions), "resident": self.resident, "pushes_pinned": self.installed,
                "pushes_waited": self.waited}
