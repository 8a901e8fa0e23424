"""Generation engines: one async contract (`base.py`), one module set per backend.

- `base.py`: `GenerationEngine`, `GenerationRequest`, `SamplingParams`, `SampleOutput`,
  `EngineStats`, `join_outputs` — all the runtime may rely on.
- native JAX backend: `jax_engine.py` (`JaxEngine`, the async wrapper) over `core.py`
  (`EngineCore`, `EngineConfig`: synchronous continuous batching), `steps.py` (jitted prefill /
  decode), `sampling.py`, `scheduler.py` (priority queue, per-slot state), `weights.py`
  (checks on pushed weights).

A new backend (e.g. vLLM) adds `<name>_engine.py` implementing `GenerationEngine`.
"""
