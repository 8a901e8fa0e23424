"""Joining the Ray cluster that hosts the generation workers: `connect(cfg)`.

`ray.init` retries an unreachable address for minutes and has no deadline of its own, so joining
is a TCP probe of a HOST:PORT address first, then `ray.init` in a thread under
`cluster.init_timeout_s` (a private `local` cluster starts in the caller's thread: see `connect`),
and every failure is one line naming `cluster.address` and the usual fix. `connect` also checks
that the cluster has the GPUs the workers ask for. The job calls it (`ClusterConfig.connect`)
before the run installs its signal handlers; the proxy calls it again when it reserves the bundles
(a no-op once joined).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from jaxrl_async.cluster.ray.config import RayClusterConfig


def connect(cfg: RayClusterConfig) -> None:
    """Join (or start) the Ray cluster and check its GPUs; one-line errors otherwise."""
    import ray

    if not ray.is_initialized():
        _check_reachable(cfg.address)
        if cfg.address == "local":
            # In the caller's thread: Ray starts the private head's processes with
            # PR_SET_PDEATHSIG, which Linux fires when the *thread* that started them ends, so a
            # start from `_init_within`'s thread would kill the cluster as that thread returns.
            # A local start has no remote address to retry, so it needs no deadline.
            error = _init_here(lambda: ray.init(include_dashboard=False, log_to_driver=False))
        else:
            error = _init_within(cfg, lambda: ray.init(address=cfg.address, log_to_driver=False))
        if error is not None and not isinstance(error, (ConnectionError, RuntimeError, ValueError)):
            raise error  # not a failure to connect: its own traceback
        if error is not None:
            first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            raise ConnectionError(f"cluster.address={cfg.address!r}: cannot reach a Ray cluster ({first}); "
                                  "start one with `ray start --head` or fix the address") from None
    need = cfg.num_workers * cfg.gpus_per_worker
    have = ray.cluster_resources().get("GPU", 0)
    if need > have:
        raise ValueError(f"cluster.num_workers={cfg.num_workers} x gpus_per_worker={cfg.gpus_per_worker} "
                         f"needs {need:g} GPUs; the Ray cluster has {have:g}")


def _init_here(init: Callable[[], None]) -> BaseException | None:
    """`init()` in this thread; returns what it raised, if anything (`connect` sorts it)."""
    try:
        init()
    except BaseException as error:  # noqa: BLE001 - connect re-raises what is not a connection error
        return error
    return None


def _init_within(cfg: RayClusterConfig, init: Callable[[], None]) -> BaseException | None:
    """`init()` (`ray.init`) with a deadline, `cluster.init_timeout_s`: in a daemon thread, since
    Ray's own retries have none (a head started on 127.0.0.1 answers the TCP probe, then `ray.init`
    retries the host's interface address for ever). Returns what it raised, if anything (`connect`
    sorts it); past the deadline, a one-line ConnectionError naming the fixes."""
    outcome: list[BaseException | None] = []
    thread = threading.Thread(target=lambda: outcome.append(_init_here(init)), name="ray-init", daemon=True)
    thread.start()
    thread.join(cfg.init_timeout_s)
    if not outcome:
        raise ConnectionError(
            f"cluster.address={cfg.address!r}: ray.init did not finish within cluster.init_timeout_s="
            f"{cfg.init_timeout_s:g} s; a head on 127.0.0.1 needs RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 in this "
            "process's environment (Ray swaps the loopback for the interface address), a remote head "
            "`ray start --head --node-ip-address=<reachable address>`")
    return outcome[0]


def _check_reachable(address: str, timeout_s: float = 5.0) -> None:
    """A TCP probe of a HOST:PORT address: `ray.init` itself retries a dead address for minutes."""
    import socket

    if address in ("auto", "local") or address.startswith("ray://"):
        return
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"cluster.address={address!r}: expected 'auto', 'local', 'HOST:PORT' or 'ray://HOST:PORT'")
    try:
        socket.create_connection((host, int(port)), timeout=timeout_s).close()
    except OSError as error:
        raise ConnectionError(f"cluster.address={address!r}: cannot reach a Ray cluster ({error}); "
                              "start one with `ray start --head` or fix the address") from None
