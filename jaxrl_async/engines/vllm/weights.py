"""JAX params -> checked, HF-named torch tensors for a vLLM weight push.

vLLM would accept a renamed, transposed or float32-instead-of-bfloat16 tensor and either die in
its worker (killing the engine) or, worse, generate from garbage. So every push is checked here,
in the caller, against the engine's own parameters: the tree structure, each leaf's shape and
dtype, and then each HF tensor's name, shape and dtype (the HF layout comes from the models'
`to_hf_state_dict`, the same table the checkpoint loader uses), both by
`jaxrl_async.trees.check_like`.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
from flax import nnx

from jaxrl_async.models.config import ModelConfig
from jaxrl_async.models.hf_weights import to_hf_state_dict
from jaxrl_async.models.lora import LoraAdapter, check_adapter
from jaxrl_async.trees import check_like, pure


class WeightChecker:
    """Remembers the engine's parameter layout (no values) and converts + checks pushes."""

    def __init__(self, model: nnx.Module, cfg: ModelConfig):
        self.cfg = cfg
        state = nnx.state(model, nnx.Param)
        self._abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), state)
        self._reference = {"params": nnx.to_pure_dict(self._abstract)}
        self.hf_spec = {name: jax.ShapeDtypeStruct(a.shape, a.dtype)
                        for name, a in to_hf_state_dict(state, cfg).items()}

    def to_hf(self, params: Any) -> dict[str, np.ndarray]:
        """`params` (an `nnx.State` or its pure dict) -> {hf_name: np.ndarray}; ValueError
        (`TreeMismatch`) naming the first leaf or tensor that differs from the engine's."""
        params = pure(params)
        check_like(self._reference, {"params": params}, "the pushed weights")
        state = jax.tree.map(lambda x: x, self._abstract)
        nnx.replace_by_pure_dict(state, params)
        tensors = to_hf_state_dict(state, self.cfg)
        self.check_hf(tensors)
        return tensors

    def check_adapter(self, adapter: LoraAdapter) -> None:
        """A LoRA push: every adapted param is a layer weight of the engine's model and A, B fit it
        (a one-line ValueError naming the param otherwise, before anything is written)."""
        check_adapter(self._reference["params"]["layers"], adapter, "the pushed adapter")

    def check_hf(self, tensors: dict[str, np.ndarray]) -> None:
        """HF names, shapes and dtypes exactly as the engine's (the last gate before vLLM)."""
        check_like(self.hf_spec, tensors, "the HF tensors for vLLM")


def to_torch(tensors: dict[str, np.ndarray], device: str = "cpu") -> dict[str, Any]:
    """numpy (incl. ml_dtypes bfloat16) -> contiguous torch tensors on `device`."""
    import torch

    out = {}
    for name, array in tensors.items():
        array = np.ascontiguousarray(array)
        if not array.flags.writeable:  # device_get can return read-only views; torch wants to own
            array = array.copy()
        if array.dtype.name == "bfloat16":  # torch cannot read ml_dtypes' bfloat16: reinterpret
            tensor = torch.from_numpy(array.view(np.uint16)).view(torch.bfloat16)
        else:
            tensor = torch.from_numpy(array)
        out[name] = tensor.to(device)
    return out
