"""Code that runs inside vLLM's worker process (`worker_extension_cls`), next to the model.

vLLM mixes this class into its worker, so the engine can call `collective_rpc("jaxrl_reload",
...)`. It imports neither JAX nor the rest of jaxrl_async: the worker process has only torch.

Why not `collective_rpc("reload_weights", kwargs={"weights_iterator": ...})` directly: the RPC
channel (msgpack) does not carry a list of torch tensors (they arrive as nested lists), so the
in-memory transport ships one safetensors blob (bytes travel as one zero-copy frame) and this
method turns it back into tensors. `reload_weights` (not `model.load_weights`) is required: on
the CPU backend the linear layers keep a repacked copy of each weight, which only the reload
path's post-processing refreshes — a plain `load_weights` changes the parameter but not the
outputs.
"""

from __future__ import annotations


class WeightReceiver:
    """Methods added to vLLM's worker; `self` is the vLLM Worker."""

    def jaxrl_reload(self, blob: bytes) -> int:
        """Load HF-named tensors from a safetensors `blob` into the model; returns their count."""
        from safetensors.torch import load

        tensors = load(blob)
        self.reload_weights(weights_iterator=iter(tensors.items()))
        return len(tensors)
