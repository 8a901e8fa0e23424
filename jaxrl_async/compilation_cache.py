"""A persistent XLA compilation cache for the command-line entry points.

The engine runs the layers unrolled over per-layer weights (models/transformer.py explains why),
so its first compilation grows with depth: SmolLM2-135M on 2 CPU cores takes ~10 s where the
scanned layout took ~2 s. Cached on disk, a later run of the same shapes starts in seconds
(`python -m jaxrl_async.generate model=smollm2_135m`: 14.5 s cold, 8.5 s warm).

Only `python -m jaxrl_async.train` / `.generate` turn it on, never library code or tests (the
engine tests count backend compilations, which a cache hit would hide).
"""

from __future__ import annotations

import os
from pathlib import Path

import jax


def enable_compilation_cache() -> None:
    """Cache compiled programs in ~/.cache/jaxrl_async/jax (or $XDG_CACHE_HOME/jaxrl_async/jax).

    A cache directory the user already chose (JAX_COMPILATION_CACHE_DIR or jax.config) wins;
    JAXRL_COMPILATION_CACHE=0 turns caching off.
    """
    if os.environ.get("JAXRL_COMPILATION_CACHE", "1") == "0" or jax.config.jax_compilation_cache_dir:
        return
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    jax.config.update("jax_compilation_cache_dir", str(base / "jaxrl_async" / "jax"))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)
