"""The transport registry (`transports/__init__.py`) and the `WeightTransport` contract's defaults."""

import asyncio

import pytest

from jaxrl_async.transports import TRANSPORTS, make_transport
from jaxrl_async.transports.disk import DiskTransport
from jaxrl_async.transports.memory import MemoryTransport
from jaxrl_async.transports.nccl import NcclTransport


def test_the_registry_maps_each_config_name_to_the_transport_of_that_name():
    assert TRANSPORTS == {"memory": MemoryTransport, "disk": DiskTransport, "nccl": NcclTransport}
    assert all(cls.name == name for name, cls in TRANSPORTS.items())


def test_an_unknown_transport_is_a_one_line_error_listing_the_known_ones():
    with pytest.raises(ValueError, match=r"engine.transport='tcp': must be one of \['disk', 'memory', 'nccl'\]"):
        make_transport("tcp")


def test_make_transport_builds_the_transport_with_its_options(tmp_path):
    disk = make_transport("disk", directory=str(tmp_path), keep=3)
    assert isinstance(disk, DiskTransport) and (disk.directory, disk.keep) == (tmp_path, 3)
    nccl = make_transport("nccl", master_port=1234)
    assert (nccl.master_address, nccl.master_port) == ("127.0.0.1", 1234)


def test_only_nccl_adds_engine_args_and_memory_needs_no_setup_or_close():
    assert make_transport("memory").engine_args() == {} and make_transport("disk").engine_args() == {}
    assert make_transport("nccl").engine_args() == {"weight_transfer_config": {"backend": "nccl"}}

    async def lifecycle():
        memory = make_transport("memory")
        await memory.setup(llm=None)
        await memory.close()

    asyncio.run(lifecycle())
