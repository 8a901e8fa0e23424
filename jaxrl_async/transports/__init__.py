"""Weight transports into vLLM engines (see base.py); `TRANSPORTS` maps config names to classes."""

import inspect

from jaxrl_async.transports.base import WeightTransport
from jaxrl_async.transports.disk import DiskTransport
from jaxrl_async.transports.memory import MemoryTransport
from jaxrl_async.transports.nccl import NcclTransport

TRANSPORTS: dict[str, type[WeightTransport]] = {}
for _cls in (MemoryTransport, DiskTransport, NcclTransport):
    if _cls.name in TRANSPORTS:
        raise RuntimeError(f"transport name {_cls.name!r} registered twice")
    TRANSPORTS[_cls.name] = _cls


def check_transport_options(name: str, options: dict) -> None:
    """Option names `name`'s constructor does not take are a one-line error at start-up (the
    constructor's signature is the list of options: no second list to drift from it)."""
    accepted = [p for p in inspect.signature(TRANSPORTS[name].__init__).parameters if p != "self"]
    unknown = sorted(set(options) - set(accepted))
    if unknown:
        raise ValueError(f"engine.transport_options.{unknown[0]}: not an option of transport {name!r} "
                         f"(it takes {accepted})")


def make_transport(name: str, **options) -> WeightTransport:
    """The transport registered as `name`, built with its options (e.g. disk's `directory`)."""
    if name not in TRANSPORTS:
        raise ValueError(f"engine.transport={name!r}: must be one of {sorted(TRANSPORTS)}")
    return TRANSPORTS[name](**options)


__all__ = ["TRANSPORTS", "WeightTransport", "check_transport_options", "make_transport"]
