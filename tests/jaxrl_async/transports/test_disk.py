"""The shared-directory transport: `v<version>/model.safetensors`, written whole, reloaded by path."""

import asyncio

import pytest

from jaxrl_async.transports.disk import DiskTransport
from tests.helpers.fake_vllm import FakeLLM

torch = pytest.importorskip("torch", reason="safetensors.torch needs torch (pip install -e '.[test]')")


def tensors(value: float) -> dict:
    return {"lm_head.weight": torch.full((2, 3), value)}


def push(transport: DiskTransport, llm: FakeLLM, version: int) -> None:
    asyncio.run(transport.push(llm, tensors(float(version)), version))


def test_a_push_writes_the_version_directory_then_asks_the_workers_to_reload_that_path(tmp_path):
    llm = FakeLLM()
    push(DiskTransport(str(tmp_path)), llm, 3)
    assert llm.calls == [("reload_weights", (), {"weights_path": str(tmp_path / "v00000003")})]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["v00000003"]  # no staging directory left
    assert [p.name for p in (tmp_path / "v00000003").iterdir()] == ["model.safetensors"]
    assert torch.equal(llm.workers[0].loaded[0]["lm_head.weight"], tensors(3.0)["lm_head.weight"])


def test_only_the_newest_keep_versions_stay_and_a_repeated_version_is_replaced(tmp_path):
    transport, llm = DiskTransport(str(tmp_path), keep=2), FakeLLM()
    for version in (9, 10, 11, 11):  # zero-padded names: v00000010 sorts after v00000009
        push(transport, llm, version)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["v00000010", "v00000011"]
    assert [loaded["lm_head.weight"][0, 0].item() for loaded in llm.workers[0].loaded] == [9.0, 10.0, 11.0, 11.0]


def test_close_removes_the_directory_only_when_the_transport_made_it(tmp_path):
    own = DiskTransport()
    push(own, FakeLLM(), 1)
    asyncio.run(own.close())
    assert not own.directory.exists()
    given = DiskTransport(str(tmp_path / "shared"))
    push(given, FakeLLM(), 1)
    asyncio.run(given.close())
    assert (tmp_path / "shared" / "v00000001" / "model.safetensors").exists()


def test_keep_below_one_is_refused_naming_the_value():
    with pytest.raises(ValueError, match=r"disk transport keep=0: must be >= 1"):
        DiskTransport(keep=0)
