"""`EngineConfig` (config.py): the checks a JAX engine's keys get when the config is built."""

import pytest

from jaxrl_async.engines.jax.config import CACHE_DTYPES, EngineConfig
from jaxrl_async.models.config import DTYPES


def test_the_cache_dtypes_are_the_models_dtypes():
    assert CACHE_DTYPES == DTYPES


def test_fewer_kv_pages_than_slots_are_refused_when_the_config_is_built():
    # The probe of issue 24: this passed the check and failed at the run's first request.
    with pytest.raises(ValueError, match=r"^engine\.kv_pages=8: must be >= engine\.num_slots=64 \(every decoding "
                                         r"sample holds a page; raise engine\.kv_pages or lower engine\.num_slots\)$"):
        EngineConfig(num_slots=64, max_len=128, page_size=16, kv_pages=8)
    assert EngineConfig(num_slots=8, max_len=128, page_size=16, kv_pages=8).total_pages == 8


def test_buckets_double_from_min_bucket_up_to_max_len():
    assert EngineConfig(min_bucket=16, max_len=100).buckets() == [16, 32, 64, 100]
