"""Generation engines: one async contract (`base.py`), one module set per backend.

- `base.py`: `GenerationEngine`, `GenerationRequest`, `SamplingParams`, `SampleOutput`,
  `EngineStats`, `join_outputs` — all the runtime may rely on — and `least_loaded`, the
  routing rule of every engine that fronts several.
- native JAX backend: `jax_engine.py` (`JaxEngine`, the async wrapper) over `core.py`
  (`EngineCore`, `EngineConfig`: synchronous continuous batching; `mesh=` runs one engine
  tensor-parallel over a (1, 1, T) device mesh), `layout.py` (its jitted steps per mesh and
  pushed weights moved on device), `steps.py` (jitted prefill / decode),
  `sampling.py`, `scheduler.py` (priority queue, per-slot state), `weights.py` (checks on pushed
  weights).
- `replicated.py`: `ReplicatedEngine`, data-parallel replicas (e.g. one `JaxEngine` per mesh)
  as one engine: least-loaded routing, merged outputs, weights pushed to all.
- `registry.py`: `engine.name` -> its config dataclass and builder, for train.py and the Ray
  workers alike.

A new backend (e.g. vLLM) adds `<name>_engine.py` implementing `GenerationEngine` and registers
its config and builder in `registry.py`.
"""
