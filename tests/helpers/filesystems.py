"""A real, small filesystem for disk-full tests: a tmpfs mounted where the test says."""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


@contextlib.contextmanager
def small_filesystem(mount: Path, size: str = "64k", *, read_only: bool = False) -> Iterator[Path]:
    """Mount a `size` tmpfs at `mount` (created if missing; `read_only`: mounted ro) for the block;
    skips the test where mounting is not allowed (it needs root, as in CI's container)."""
    mount.mkdir(parents=True, exist_ok=True)
    options = f"size={size}" + (",ro" if read_only else "")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(mount)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here (needs root): {done.stderr.decode().strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=True)
