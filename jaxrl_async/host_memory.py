"""Give freed heap memory back to the operating system.

glibc's malloc serves allocations under its mmap threshold (which grows to 32 MiB as large blocks
are freed) from heap arenas, one per thread that allocates, and keeps what is freed there for
reuse instead of returning it. A checkpoint save on CPU encodes the trainer's 1.5 GiB (at
SmolLM2-135M) in chunks of a few MiB on tensorstore's threads: after the write the process keeps
~1.3 GiB resident that nothing uses (docs/memory.md). `malloc_trim(0)` walks every arena and
releases its free pages. Elsewhere (no glibc: macOS, musl) there is nothing to call, and `trim`
does nothing.
"""

from __future__ import annotations

import ctypes
import functools


@functools.cache
def _malloc_trim():
    try:
        return ctypes.CDLL(None).malloc_trim
    except (AttributeError, OSError):
        return None


def trim() -> bool:
    """Release the free pages of every malloc arena; True where glibc did it."""
    malloc_trim = _malloc_trim()
    if malloc_trim is None:
        return False
    malloc_trim(0)
    return True
