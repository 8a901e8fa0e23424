"""The native JAX engine (`engine=jax`): continuous batching over KV-cache slots or pages.

- `config.py`: `EngineConfig`, the `engine.` keys (imports no JAX).
- `engine.py`: `JaxEngine`, the async `GenerationEngine`: an `EngineCore` in a worker thread fed
  typed commands; `make_core` picks the core for a config.
- `core.py`: `EngineCore`: synchronous continuous batching; `mesh=` runs one engine
  tensor-parallel over a (1, 1, T) device mesh.
- `slots.py`: the core's public slot API (`Slots`, `LiveRequests`) that migration and paging use.
- `packing.py`: prefixes packed into prefill rows (every prefill goes through it).
- `speculator.py`: `Speculator`: which samples draft, and the speculative call.
- `compiles.py`: what the engine compiles (buckets, live decode lengths) and `COMPILE_COUNTS`.
- `migration.py`: detach / attach of a straggler's samples between cores.
- `speculative.py`: exact speculative sampling (draft, verify, accept/reject), jitted.
- `paged.py`: `PagedEngineCore`, the core over a paged KV cache (`engine.page_size` > 0):
  admission by free pages, shared prompt pages, preemption when pages run out.
- `paging.py`: the host-side page pool and per-slot page tables (no JAX).
- `paged_attention.py`: decode attention over pages: XLA gather and a Pallas kernel, by backend.
- `layout.py`: its jitted steps per mesh, and pushed weights moved onto it device to device.
- `steps.py`: the jitted prefill / copy-prefix / decode steps, pure functions.
- `sampling.py`: per-slot temperature, top-p, top-k and greedy sampling.
- `scheduler.py`: the host-side priority queue and per-slot sequence state (no JAX).
- `weights.py`: checks on pushed weights (structure, shape, dtype) before the engine takes them.
"""
