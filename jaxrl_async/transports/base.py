"""How new weights reach a vLLM engine: the `WeightTransport` contract and its registry.

The engine (`engines/vllm/engine.py`) owns the pause / version bookkeeping and calls a transport
only to move an already checked `{hf_name: torch.Tensor}` dict into vLLM's workers. One file per
transport:
- `memory`: one safetensors blob through vLLM's RPC channel (same host, any device).
- `disk`: a safetensors file in a shared directory, reloaded by path (any host that sees it).
- `nccl`: vLLM's NCCL weight-transfer engine, GPU to GPU (CUDA only).

To add one: subclass `WeightTransport` in `transports/<name>.py`, give it a unique `name`, and
add it to `TRANSPORTS` in `transports/__init__.py`.
"""

from __future__ import annotations

import abc
from typing import Any, ClassVar


class WeightTransport(abc.ABC):
    """Moves weights into a running vLLM `AsyncLLM`. All methods run on the engine's event loop."""

    name: ClassVar[str]

    def engine_args(self) -> dict[str, Any]:
        """Extra `AsyncEngineArgs` this transport needs (e.g. a weight-transfer backend)."""
        return {}

    async def setup(self, llm: Any) -> None:
        """Called once after the engine started (e.g. to open a communicator)."""

    @abc.abstractmethod
    async def push(self, llm: Any, tensors: dict[str, Any], version: int) -> None:
        """Load `tensors` (HF names -> torch tensors in the engine's dtype, already checked) into
        every worker; returns once the model uses them. Generation is paused by the caller."""

    async def close(self) -> None:
        """Release what `setup` opened."""
