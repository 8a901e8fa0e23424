"""Test-wide setup. JAX sees 4 CPU devices so that sharding tests run on one machine."""

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=4")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

try:  # hypothesis is a test extra; the "mutation" profile makes benchmarks/mutation.sh's verdicts reproducible
    from hypothesis import settings

    settings.register_profile("mutation", derandomize=True, database=None)
    settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))
except ImportError:
    pass
