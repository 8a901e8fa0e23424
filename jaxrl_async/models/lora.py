"""Low-rank adapters (LoRA, Hu et al. 2021) on the projections of `Transformer`'s layers.

A target projection W (the stacked `layers/<param>` of models/transformer.py, [L, *in, *out])
gets A [L, *in, r] and B [L, r, *out]; the layer then computes with W + scale * A B, scale =
alpha / r. A starts like PEFT's (Kaiming-uniform, bound 1/sqrt(fan_in)) and B at zero, so an
untrained adapter is the base model exactly. Targets are named by their HF module names
(`models.config.PROJECTIONS`), which are also PEFT's `target_modules` (models/peft_adapter.py).

Merged, not a side branch: the layer adds scale * A B to W and runs the same `dense` and `mlp`
(whose hand-written gradients take the weights whole) instead of computing x A B beside x W. That
keeps one forward for full fine-tuning, LoRA training, the engine and the export; autodiff turns
the gradient of the merged weight into A's and B's, one layer at a time inside the layer scan, so
no full-size gradient of the stack is ever held. The cost: each layer's backward forms its
weight's [in, out] gradient (the matmul full fine-tuning does anyway), and in bfloat16 a delta
below W's rounding is lost in the sum (the merge itself is computed in float32).

Why not qwix (tunix's `LoraProvider`): it intercepts `dot_general` / `einsum` whose right operand
is a Flax module's own parameter. Here the layers' parameters are stacked and sliced by
`jax.lax.scan`, and the MLP's matmuls run inside a `custom_vjp`: neither operand is a module
parameter qwix can find, so it would silently adapt nothing.

Unmerged, per token (`adapter_output`): the JAX engine with `engine.adapter_versions=K > 1`
keeps K adapters resident beside one base and gives each token its sequence's own, the S-LoRA /
punica way: y = x W + scale * (x A[v]) B[v]. The K rank-r products x A[k] are computed for every
token, masked to the token's entry, and multiplied by the stacked B as one [K r, out] matrix, so
K versions cost K rank-r matmuls per projection, not K merged weight copies.

This module imports nothing of the model: it works on any tree whose `layers` dict holds the
targets, stacked ([L, ...]) or one layer's slice.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import flax
import jax
import jax.numpy as jnp

# HF module name -> (our parameter under `layers/`, how many leading axes of a layer's weight are
# its input: `dense(x, w, in_axes)` in models/transformer.py).
TARGETS: dict[str, tuple[str, int]] = {
    "q_proj": ("wq", 1),
    "k_proj": ("wk", 1),
    "v_proj": ("wv", 1),
    "o_proj": ("wo", 2),
    "gate_proj": ("w_gate", 1),
    "up_proj": ("w_up", 1),
    "down_proj": ("w_down", 1),
}


@flax.struct.dataclass
class LoraAdapter:
    """The adapter as it travels: its arrays and its scale (static: part of what a jit compiles).

    `params` is {"layers": {param: {"a": [L, *in, r], "b": [L, r, *out]}}}; inside the layer scan
    the leading L axis is sliced off."""

    params: dict
    scale: float = flax.struct.field(pytree_node=False)

    @property
    def rank(self) -> int:
        return next(iter(self.params["layers"].values()))["a"].shape[-1]


def adapter_shapes(layer_shapes: dict[str, tuple[int, ...]], rank: int, targets: tuple[str, ...]
                   ) -> dict[str, dict[str, tuple[int, ...]]]:
    """{param: {"a": shape, "b": shape}} for stacked layer weights `layer_shapes` ({param: shape})."""
    out = {}
    for target in targets:
        name, in_axes = TARGETS[target]
        shape = layer_shapes[name]
        out[name] = {"a": (*shape[:1 + in_axes], rank), "b": (shape[0], rank, *shape[1 + in_axes:])}
    return out


def rank_limit(layer_shapes: dict[str, tuple[int, ...]], targets: tuple[str, ...]) -> tuple[str, int]:
    """(target, its smallest of in/out features): a rank above it adds nothing but parameters."""
    limits = []
    for target in targets:
        name, in_axes = TARGETS[target]
        shape = layer_shapes[name][1:]  # one layer
        limits.append((min(math.prod(shape[:in_axes]), math.prod(shape[in_axes:])), target))
    limit, target = min(limits)
    return target, limit


def init_adapter(layer_shapes: dict[str, tuple[int, ...]], rank: int, targets: tuple[str, ...],
                 key: jax.Array) -> dict:
    """A fresh float32 adapter {"layers": {param: {"a", "b"}}}: A ~ U(+-1/sqrt(fan_in)) (PEFT's
    `kaiming_uniform_(a=sqrt(5))`), B = 0."""
    layers = {}
    for (name, shapes), k in zip(adapter_shapes(layer_shapes, rank, targets).items(),
                                 jax.random.split(key, len(targets))):
        fan_in = math.prod(shapes["a"][1:-1])
        bound = 1.0 / math.sqrt(fan_in)
        layers[name] = {"a": jax.random.uniform(k, shapes["a"], jnp.float32, -bound, bound),
                        "b": jnp.zeros(shapes["b"], jnp.float32)}
    return {"layers": layers}


def delta(w: jax.Array, a: jax.Array, b: jax.Array) -> jax.Array:
    """A B in float32, shaped like `w` ([*lead, *in, *out]; a [*lead, *in, r], b [*lead, r, *out])."""
    lead = a.ndim + b.ndim - 2 - w.ndim
    lead_shape, rank = w.shape[:lead], a.shape[-1]
    a2 = a.reshape(*lead_shape, -1, rank)  # [*lead, I, r]
    b2 = b.reshape(*lead_shape, rank, -1)  # [*lead, r, O]
    return jnp.matmul(a2, b2, preferred_element_type=jnp.float32).reshape(w.shape)


def merge_layers(layers: dict, adapter_layers: dict, scale: float) -> dict:
    """`layers` ({param: weight}, stacked or one layer) with W + scale * A B for each adapted
    param, summed in float32 and cast back to W's dtype."""
    merged = dict(layers)
    for name, ab in adapter_layers.items():
        w = layers[name]
        merged[name] = (w.astype(jnp.float32) + scale * delta(w, ab["a"], ab["b"])).astype(w.dtype)
    return merged


def merged_params(params: dict, adapter: LoraAdapter) -> dict:
    """The model's pure params dict with the adapter merged into its stacked layers."""
    return {**params, "layers": merge_layers(params["layers"], adapter.params["layers"], adapter.scale)}


@flax.struct.dataclass
class ResidentAdapters:
    """K adapters resident at once (the engine's pinned versions) and the entry each KV slot uses.

    `layers`: one dict per layer (the generation layout), {param: {"a": [K, *in, r], "b": [K, r,
    *out]}}; `slot_entry` [S] int32: the entry each slot's tokens take. The engine passes it as its
    weights' "adapters" (models/transformer.py `forward_layers`)."""

    layers: tuple
    slot_entry: Any
    scale: float = flax.struct.field(pytree_node=False)


class TokenAdapters(NamedTuple):
    """One layer's resident adapters and the entry each token takes, as one-hot weights [..., K]."""

    params: dict  # {param: {"a": [K, *in, r], "b": [K, r, *out]}}
    select: jax.Array  # [*tokens, K] float32, one 1 per token
    scale: float


def adapter_output(x: jax.Array, ab: dict, select: jax.Array, scale: float, in_axes: int = 1) -> jax.Array:
    """scale * (x A[e]) B[e] for each token's entry e: the unmerged side branch a projection adds.

    x [*tokens, *in] (`in_axes` trailing input axes), ab {"a": [K, *in, r], "b": [K, r, *out]},
    select [*tokens, K] one-hot. Computed in float32 and cast to x's dtype: the x A of every entry,
    zeroed but the token's own, times the entries' B stacked as one [K r, out] matrix."""
    a, b = ab["a"], ab["b"]
    k, rank = a.shape[0], a.shape[-1]
    lead = x.shape[:x.ndim - in_axes]
    x2 = x.reshape(-1, math.prod(x.shape[x.ndim - in_axes:]))  # [N, I]
    xa = jnp.einsum("ni,kir->nkr", x2, a.reshape(k, -1, rank), preferred_element_type=jnp.float32)
    xa = xa * select.reshape(-1, k, 1).astype(jnp.float32)  # [N, K, r]: the token's entry only
    y = jnp.matmul(xa.reshape(-1, k * rank), b.reshape(k * rank, -1).astype(jnp.float32))
    return (scale * y).astype(x.dtype).reshape(*lead, *b.shape[2:])


def check_adapter(layers: dict, adapter: LoraAdapter, what: str) -> None:
    """A one-line ValueError unless every adapted param exists in `layers` (per-layer or stacked
    weights, by shape) and its A and B fit it; `what` names the adapter in the message."""
    for name, ab in adapter.params["layers"].items():
        if name not in layers or set(ab) != {"a", "b"}:
            raise ValueError(f"{what}: layers/{name} is not an adaptable weight of this model")
        w, a, b = layers[name], ab["a"], ab["b"]
        lead = a.ndim + b.ndim - 2 - w.ndim
        ok = (lead >= 0 and a.shape[-1] == b.shape[lead] == adapter.rank and a.shape[:lead] == b.shape[:lead]
              and tuple(a.shape[:-1]) + tuple(b.shape[lead + 1:]) == tuple(w.shape))
        if not ok:
            raise ValueError(f"{what}: layers/{name} A {list(a.shape)} and B {list(b.shape)} do not fit the "
                             f"weight {list(w.shape)} at rank {adapter.rank}")


def tree_nbytes(tree: Any) -> int:
    """Bytes of every array leaf of `tree`: what a push of it moves."""
    return sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(tree))
