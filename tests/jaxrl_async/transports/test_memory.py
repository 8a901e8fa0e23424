"""The in-memory transport: one safetensors blob per push, loaded by the worker extension in every worker."""

import asyncio

import pytest

from jaxrl_async.transports.memory import MemoryTransport
from tests.helpers.fake_vllm import FakeLLM, FakeWorker

torch = pytest.importorskip("torch", reason="safetensors.torch needs torch (pip install -e '.[test]')")


def tensors() -> dict:
    return {"model.embed_tokens.weight": torch.arange(6, dtype=torch.float32).reshape(2, 3),
            "lm_head.weight": torch.ones(3, 2, dtype=torch.bfloat16)}


def test_a_push_reaches_every_worker_as_the_same_names_values_and_dtypes():
    llm = FakeLLM([FakeWorker(), FakeWorker()])
    asyncio.run(MemoryTransport().push(llm, tensors(), version=1))
    assert [method for method, _, _ in llm.calls] == ["jaxrl_reload"]  # one RPC, not one per tensor
    for worker in llm.workers:
        (loaded,) = worker.loaded
        assert loaded.keys() == tensors().keys()
        for name, sent in tensors().items():
            assert loaded[name].dtype == sent.dtype and torch.equal(loaded[name], sent), name


def test_a_worker_that_loads_another_count_fails_the_push_naming_the_counts():
    class Short:
        def jaxrl_reload(self, blob: bytes) -> int:
            return 1

    with pytest.raises(RuntimeError, match=r"memory transport: workers loaded \[2, 1\] tensors, sent 2"):
        asyncio.run(MemoryTransport().push(FakeLLM([FakeWorker(), Short()]), tensors(), version=1))
