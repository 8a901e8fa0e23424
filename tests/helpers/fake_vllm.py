"""Hand-written stand-ins for vLLM's `AsyncLLM` and its worker, for tests without vLLM.

`FakeLLM.collective_rpc` runs the named method on every `FakeWorker`, as vLLM runs an RPC on each
of its workers and returns their answers in a list. `FakeWorker` mixes in the real
`WeightReceiver`, as vLLM does with `worker_extension_cls`, and keeps what `reload_weights` got.
"""

from __future__ import annotations

from typing import Any

from jaxrl_async.engines.vllm.worker import WeightReceiver


class FakeWorker(WeightReceiver):
    def __init__(self) -> None:
        self.loaded: list[dict[str, Any]] = []  # one {name: tensor} per reload

    def reload_weights(self, weights_iterator=None, weights_path: str | None = None) -> None:
        if weights_path is not None:  # vLLM reads the checkpoint directory it is given
            from safetensors.torch import load_file

            weights_iterator = iter(load_file(f"{weights_path}/model.safetensors").items())
        self.loaded.append(dict(weights_iterator))


class FakeLLM:
    def __init__(self, workers: list | None = None) -> None:
        self.workers = [FakeWorker()] if workers is None else workers
        self.calls: list[tuple[str, tuple, dict]] = []  # (method, args, kwargs) per RPC

    async def collective_rpc(self, method: str, args: tuple = (), kwargs: dict | None = None) -> list:
        kwargs = kwargs or {}
        self.calls.append((method, args, kwargs))
        return [getattr(worker, method)(*args, **kwargs) for worker in self.workers]
