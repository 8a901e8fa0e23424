"""NCCL transport: GPU-to-GPU broadcast through vLLM's own NCCL weight-transfer engine.

The process that holds the `AsyncLLM` becomes NCCL rank 0 (the sender) and every vLLM worker a
receiver (`weight_transfer_config={"backend": "nccl"}`). Each push broadcasts the tensors from
this process's GPU straight into the workers' parameters: no host copy and no file. The tensors
must already be CUDA tensors (`engines/vllm/weights.py to_torch(..., device="cuda")` copies them there).

vLLM's trainer-side engine is synchronous and must run the workers' `update_weights` RPC
concurrently with the broadcast, so it runs in a thread and reaches the event loop's `AsyncLLM`
through `_LoopClient`. Needs CUDA GPUs and a free `master_port`; on a CPU-only machine `setup`
raises a one-line error (tests/jaxrl_async/transports/test_nccl.py, where vLLM is installed).
"""

from __future__ import annotations

import asyncio
from typing import Any

from jaxrl_async.transports.base import WeightTransport


class _LoopClient:
    """vLLM's `VLLMWeightSyncClient` protocol over an `AsyncLLM` living on `loop` (called from a thread)."""

    def __init__(self, llm: Any, loop: asyncio.AbstractEventLoop):
        self._llm, self._loop = llm, loop

    def _call(self, coro) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def init_weight_transfer_engine(self, init_info: dict) -> None:
        self._call(self._llm.collective_rpc("init_weight_transfer_engine", kwargs={"init_info": init_info}))

    def start_weight_update(self) -> None:
        self._call(self._llm.start_weight_update())

    def update_weights(self, update_info: Any) -> None:
        self._call(self._llm.collective_rpc("update_weights", kwargs={"update_info": update_info}))

    def finish_weight_update(self, weight_version: str | None = None) -> None:
        self._call(self._llm.finish_weight_update(weight_version))


class NcclTransport(WeightTransport):
    name = "nccl"

    def __init__(self, master_address: str = "127.0.0.1", master_port: int = 29555):
        self.master_address, self.master_port = master_address, master_port
        self._sender = None
        self._source = None

    def engine_args(self) -> dict[str, Any]:
        return {"weight_transfer_config": {"backend": "nccl"}}

    async def setup(self, llm: Any) -> None:
        import torch
        from vllm.distributed.weight_transfer.base import ParamMeta, WeightSource
        from vllm.distributed.weight_transfer.nccl_engine import (
            NCCLTrainerInitInfo,
            NCCLTrainerWeightTransferEngine,
        )

        if not torch.cuda.is_available():
            raise RuntimeError("transport=nccl needs CUDA GPUs (torch.cuda.is_available() is False); "
                               "use transport=memory or transport=disk")

        class _Source(WeightSource):
            """The tensors of the push in progress (set by `push` before each send)."""

            tensors: dict[str, Any] = {}

            def metadata(self) -> list:
                return [ParamMeta(n, t.dtype, tuple(t.shape)) for n, t in self.tensors.items()]

            def __iter__(self):
                return iter(self.tensors.items())

        world_size = llm.vllm_config.parallel_config.world_size + 1  # the workers + this sender
        self._source = _Source()
        client = _LoopClient(llm, asyncio.get_running_loop())
        info = NCCLTrainerInitInfo(master_address=self.master_address, master_port=self.master_port,
                                   world_size=world_size)
        self._sender = await asyncio.to_thread(
            NCCLTrainerWeightTransferEngine.trainer_init, info, client=client, source=self._source)

    async def push(self, llm: Any, tensors: dict[str, Any], version: int) -> None:
        bad = next((n for n, t in tensors.items() if not t.is_cuda), None)
        if bad is not None:
            raise ValueError(f"transport=nccl: tensor {bad} is on {tensors[bad].device}; NCCL sends CUDA tensors only")
        self._source.tensors = tensors
        await asyncio.to_thread(self._sender.send_weights)

    async def close(self) -> None:
        if self._sender is not None:
            self._sender.shutdown()
            self._sender = None
