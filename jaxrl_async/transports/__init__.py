"""Weight transports into vLLM engines (see base.py); `TRANSPORTS` maps config names to classes."""

from jaxrl_async.transports.base import WeightTransport
from jaxrl_async.transports.disk import DiskTransport
from jaxrl_async.transports.memory import MemoryTransport
from jaxrl_async.transports.nccl import NcclTransport

TRANSPORTS: dict[str, type[WeightTransport]] = {}
for _cls in (MemoryTransport, DiskTransport, NcclTransport):
    if _cls.name in TRANSPORTS:
        raise RuntimeError(f"transport name {_cls.name!r} registered twice")
    TRANSPORTS[_cls.name] = _cls


def make_transport(name: str, **options) -> WeightTransport:
    """The transport registered as `name`, built with its options (e.g. disk's `directory`)."""
    if name not in TRANSPORTS:
        raise ValueError(f"engine.transport={name!r}: must be one of {sorted(TRANSPORTS)}")
    return TRANSPORTS[name](**options)


__all__ = ["TRANSPORTS", "WeightTransport", "make_transport"]
