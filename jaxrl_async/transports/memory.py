"""In-memory transport: the weights travel as one safetensors blob over vLLM's RPC channel.

The blob is built in the engine's process and handed to `WeightReceiver.jaxrl_reload` in each
worker (see engines/vllm/worker.py for why not a tensor iterator). Costs one host copy of the
weights; right for a single host (CPU or GPU workers) and small-to-medium models.
"""

from __future__ import annotations

from typing import Any

from jaxrl_async.transports.base import WeightTransport


class MemoryTransport(WeightTransport):
    name = "memory"

    async def push(self, llm: Any, tensors: dict[str, Any], version: int) -> None:
        from safetensors.torch import save

        blob = save(tensors)
        counts = await llm.collective_rpc("jaxrl_reload", args=(blob,))
        if any(count != len(tensors) for count in counts):
            raise RuntimeError(f"memory transport: workers loaded {counts} tensors, sent {len(tensors)}")
