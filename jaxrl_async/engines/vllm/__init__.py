"""The vLLM engine (`engine=vllm`): vLLM's V1 `AsyncLLM` behind the `GenerationEngine` contract.

- `config.py`: `VllmEngineConfig`, the `engine.` keys (imports nothing heavy).
- `engine.py`: `VllmEngine`, `make_engine`.
- `compat.py`: start-up checks of the installed vLLM's APIs and the model's limits.
- `weights.py`: JAX params -> checked, HF-named torch tensors for a weight push.
- `worker.py`: the class vLLM mixes into its worker process (`worker_extension_cls`).

vLLM and torch are imported inside functions only, so this package imports without them (the
engine registry reads `VllmEngineConfig` in every run). This file imports nothing: vLLM's
worker process imports `worker.py` with torch alone.
"""
