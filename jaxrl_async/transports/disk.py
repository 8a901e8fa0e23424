"""Shared-directory transport: write `v<version>/model.safetensors`, reload it by path.

Works whenever the workers can read the directory (same host, NFS, a mounted bucket), so it is
the fallback for multi-host setups without NCCL between trainer and engines. The file is written
under a temporary name and renamed, so a worker never reads half a file; only the newest `keep`
versions stay on disk.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

from jaxrl_async.transports.base import WeightTransport


class DiskTransport(WeightTransport):
    name = "disk"

    def __init__(self, directory: str | None = None, keep: int = 2):
        if keep < 1:
            raise ValueError(f"disk transport keep={keep}: must be >= 1 (the version being loaded)")
        self._owned = directory is None
        self.directory = Path(directory or tempfile.mkdtemp(prefix="jaxrl-weights-"))
        self.keep = keep

    async def push(self, llm: Any, tensors: dict[str, Any], version: int) -> None:
        from safetensors.torch import save_file

        target = self.directory / f"v{version:08d}"
        staging = self.directory / f".v{version:08d}.tmp"
        staging.mkdir(parents=True, exist_ok=True)
        save_file(tensors, str(staging / "model.safetensors"), metadata={"format": "pt"})
        if target.exists():
            shutil.rmtree(target)
        staging.rename(target)
        await llm.collective_rpc("reload_weights", kwargs={"weights_path": str(target)})
        for old in sorted(self.directory.glob("v*"))[:-self.keep]:
            shutil.rmtree(old, ignore_errors=True)

    async def close(self) -> None:
        if self._owned:
            shutil.rmtree(self.directory, ignore_errors=True)
