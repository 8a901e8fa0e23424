"""Joining the Ray cluster (cluster/ray/connect.py) without a cluster: `ray.init`'s deadline.

The real-cluster cases (an unreachable address, too few GPUs) need ray and are in
test_proxy_ray.py beside the proxy they start.
"""

from __future__ import annotations

import time

import pytest

from jaxrl_async.cluster.ray.config import RayClusterConfig
from jaxrl_async.cluster.ray.connect import _check_reachable, _init_within


def test_a_ray_init_that_never_returns_is_a_one_line_error_naming_the_fix_at_its_deadline():
    t0 = time.monotonic()
    with pytest.raises(ConnectionError) as err:
        _init_within(RayClusterConfig(address="127.0.0.1:6379", init_timeout_s=0.3), lambda: time.sleep(30))
    assert time.monotonic() - t0 < 2
    message = str(err.value)
    assert "\n" not in message and "cluster.init_timeout_s=0.3 s" in message
    assert "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0" in message and "--node-ip-address" in message


def test_a_ray_init_that_fails_or_succeeds_in_time_is_reported_as_it_happened():
    cfg = RayClusterConfig(address="127.0.0.1:6379", init_timeout_s=5)
    assert _init_within(cfg, lambda: None) is None

    def refuse():
        raise ConnectionError("no head")

    assert str(_init_within(cfg, refuse)) == "no head"


def test_an_unreachable_or_malformed_address_is_a_one_line_error_before_ray_init():
    unreachable = r"^cluster.address='127.0.0.1:1': cannot reach a Ray cluster .*ray start --head"
    with pytest.raises(ConnectionError, match=unreachable):
        _check_reachable("127.0.0.1:1", timeout_s=2)
    with pytest.raises(ValueError, match=r"^cluster.address='nohost': expected 'auto', 'local', 'HOST:PORT'"):
        _check_reachable("nohost")
    for address in ("auto", "local", "ray://127.0.0.1:1"):  # ray.init's own forms: not probed
        _check_reachable(address)
