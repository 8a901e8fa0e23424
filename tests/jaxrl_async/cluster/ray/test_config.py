"""`RayClusterConfig` (cluster/ray/config.py): every key documented where `--help` reads it, and
every bad value a one-line error naming the key the user typed."""

from __future__ import annotations

import dataclasses
import re

import pytest

from jaxrl_async.cluster.ray.config import RayClusterConfig


def test_every_key_is_documented_in_the_attributes_section():
    attributes = RayClusterConfig.__doc__.split("Attributes:", 1)[1]
    documented = re.findall(r"^      (\w+): \S", attributes, flags=re.MULTILINE)
    assert documented == [f.name for f in dataclasses.fields(RayClusterConfig)]


@pytest.mark.parametrize("values, message", [
    ({"num_workers": 0}, r"^cluster\.num_workers=0: must be >= 1$"),
    ({"gpus_per_worker": -1}, r"^cluster\.gpus_per_worker=-1: must be >= 0$"),
    ({"strategy": "FILL"}, r"^cluster\.strategy='FILL': must be one of \('PACK', 'SPREAD'"),
    ({"init_timeout_s": 0}, r"^cluster\.init_timeout_s=0: must be > 0 \(seconds\)$"),
    ({"rpc_timeout_floor_s": 200},
     r"^cluster\.rpc_timeout_floor_s=200: must be <= cluster\.rpc_timeout_ceiling_s=120$"),
])
def test_a_bad_value_is_one_line_naming_the_key(values, message):
    with pytest.raises(ValueError, match=message):
        RayClusterConfig(**values)


def test_the_adaptive_deadline_is_the_default_and_an_explicit_one_is_taken():
    assert RayClusterConfig().rpc_timeout_s is None and RayClusterConfig(rpc_timeout_s=5).rpc_timeout_s == 5
