"""Generation engines: one async contract, one subpackage per backend.

Shared by every backend:
- `base.py`: `GenerationEngine`, `GenerationRequest`, `SamplingParams`, `SampleOutput`,
  `EngineStats`, `join_outputs` — all the runtime may rely on — and `least_loaded`, the
  routing rule of every engine that fronts several.
- `replicated.py`: `ReplicatedEngine`, data-parallel replicas (e.g. one `JaxEngine` per mesh)
  as one engine: least-loaded routing, merged outputs, weights pushed to all.
- `registry.py`: `engine.name` -> its config dataclass, facts and builder, for job/ and the Ray
  workers alike.

Backends (`conf/engine/<name>.yaml`):
- `jax/`: the native JAX engine (`jax/engine.py` `JaxEngine` over `jax/core.py` `EngineCore`).
- `vllm/`: vLLM's V1 `AsyncLLM` behind the same contract (`vllm/engine.py` `VllmEngine`).

A new backend adds `engines/<name>/` with an `engine.py` implementing `GenerationEngine` and
registers its config and builder in `registry.py`. The package imports nothing, so that vLLM's
worker process can import `vllm/worker.py` with torch alone.
"""
