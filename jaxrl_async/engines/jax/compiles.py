"""What the JAX engine compiles, and the process-wide count of its compilations.

Every jitted step compiles once per shape it is called with, so the engine keeps its shapes few:

- prefill rows and prefix copies take a bucket length (`bucket`: min_bucket * 2**i, up to
  max_len): `engine_prefill` and `engine_copy_prefix` compile once per bucket;
- a decode call attends over cache positions [0, L) only, L the smallest bucket above every
  active slot's position after the call, when L is at most the backend's cut-off
  (`LIVE_BUCKET_LIMITS`), else max_len (`decode_length`): a slot at position 100 costs what a
  128-token context costs, not max_len. `engine_decode_steps` compiles once per such length (and
  again per width of the padded stop-token table: 4, 8, 16, ... stop tokens per request);
- a paged core compiles `engine_prefill_paged` per bucket, `engine_copy_page`, `engine_read_pages`
  and `engine_write_pages` once, and the decode step per live page count (paged.py).

Per model structure and engine shape; weight swaps never recompile. Without a mesh the jitted
steps are module-level (layout.SHARED_STEPS), so engines of the same shapes share them; with a
mesh each core compiles its own. `COMPILE_COUNTS` counts their backend compilations process-wide,
from jax's compile events, so it also sees recompilations without a retrace (e.g. for a changed
input sharding); JaxEngine marks an iteration that compiled (`EngineTiming.compiled`).
"""

from __future__ import annotations

import collections
from collections.abc import Callable

import jax

from jaxrl_async.engines.jax.config import EngineConfig

COMPILE_COUNTS: collections.Counter[str] = collections.Counter()
_BACKEND_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"  # jax.monitoring event
STEP_NAMES = ("engine_prefill", "engine_copy_prefix", "engine_decode_steps", "engine_prefill_paged",
              "engine_copy_page", "engine_read_pages", "engine_write_pages", "engine_speculate_rounds")


def _count_compile(event: str, duration_s: float, **kwargs) -> None:
    name = kwargs.get("fun_name", "")
    if event == _BACKEND_COMPILE_EVENT and name.startswith("jit(") and name[4:-1] in STEP_NAMES:
        COMPILE_COUNTS[name[4:-1]] += 1


jax.monitoring.register_event_duration_secs_listener(_count_compile)


# The longest live bucket a contiguous engine's decode step attends over, per backend, as a
# function of max_len; a longer context reads the whole cache (max_len). Measured with
# benchmarks/bench_decode.py (step time vs live context, batch 32):
# - cpu: XLA:CPU reads a bucket as a dense copy of that part of the cache: at max_len 2048 bucket
#   64 costs 0.36x a whole-cache step, 512 0.8x, 1024 1.8x, so past a quarter of max_len reading
#   the whole cache in place is cheaper;
# - gpu (H200, benchmarks/results/decode_h200.md): a bucket is 1.14-1.27x faster up to 1,024
#   positions and about even (0.97x) at the whole 2048-position cache.
# A backend not listed takes the cpu rule. A paged engine always attends over its live pages.
LIVE_BUCKET_LIMITS: dict[str, Callable[[int], int]] = {
    "cpu": lambda max_len: max_len // 4,
    "gpu": lambda max_len: 1024,
}


def bucket(config: EngineConfig, length: int) -> int:
    """The smallest prefill bucket that holds `length` tokens."""
    return next(b for b in config.buckets() if b >= length)


def decode_length(config: EngineConfig, platform: str, need: int) -> int:
    """A contiguous decode call's attention length: the live bucket above `need` positions, or
    max_len past the backend's cut-off (LIVE_BUCKET_LIMITS)."""
    length = bucket(config, min(need, config.max_len))
    limit = LIVE_BUCKET_LIMITS.get(platform, LIVE_BUCKET_LIMITS["cpu"])(config.max_len)
    return length if length <= limit else config.max_len
