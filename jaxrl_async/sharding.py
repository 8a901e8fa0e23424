"""Meshes and shardings: one table from logical axis names to the mesh axes data / fsdp / tensor.

Parameters declare their logical axes once, where they are created (the `logical_axes` metadata
of each `nnx.Param` in models/transformer.py); everything here is derived from that and `RULES`.
A spec that would put two logical axes of one array on the same mesh axis is refused. A dimension
that the mesh axes do not divide evenly (e.g. 3 KV heads on tensor=2) is replicated instead,
which is always correct and only costs memory.

To shard another array, give it logical axes and call `logical_sharding`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import jax
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from jaxrl_async.models.attention import KVCache

MESH_AXES = ("data", "fsdp", "tensor")

# logical axis -> mesh axis (or axes, or None = replicated).
RULES: Mapping[str, str | tuple[str, ...] | None] = {
    "batch": ("data", "fsdp"),  # activations: data parallel over data, and over fsdp too
    "seq": None,
    "layers": None,
    "vocab": "tensor",
    "embed": "fsdp",  # FSDP shards every weight along its model dimension
    "heads": "tensor",  # Megatron-style: heads, kv heads and the MLP hidden dim on tensor
    "kv_heads": "tensor",
    "head_dim": None,
    "mlp": "tensor",
}


def make_mesh(data: int = 1, fsdp: int = 1, tensor: int = 1) -> Mesh:
    """A (data, fsdp, tensor) mesh over the first data*fsdp*tensor devices."""
    for name, size in (("data", data), ("fsdp", fsdp), ("tensor", tensor)):
        if not isinstance(size, int) or size < 1:
            raise ValueError(f"make_mesh {name}={size!r}: must be a positive int")
    devices = jax.devices()
    need = data * fsdp * tensor
    if need > len(devices):
        raise ValueError(f"make_mesh data={data} fsdp={fsdp} tensor={tensor} needs {need} devices, "
                         f"{len(devices)} available")
    return Mesh(np.asarray(devices[:need]).reshape(data, fsdp, tensor), MESH_AXES)


def logical_to_spec(axes: Sequence[str | None], shape: Sequence[int], mesh: Mesh,
                    rules: Mapping[str, str | tuple[str, ...] | None] = RULES) -> PartitionSpec:
    """PartitionSpec for an array with these logical axes (uneven dims are replicated)."""
    if len(axes) != len(shape):
        raise ValueError(f"logical axes {tuple(axes)} do not match shape {tuple(shape)}")
    spec, used = [], {}
    for axis, size in zip(axes, shape):
        if axis is None:
            spec.append(None)
            continue
        if axis not in rules:
            raise ValueError(f"logical axis {axis!r} has no sharding rule; known: {sorted(rules)}")
        mesh_axes = rules[axis]
        mesh_axes = () if mesh_axes is None else (mesh_axes,) if isinstance(mesh_axes, str) \
            else tuple(mesh_axes)
        for m in mesh_axes:
            if m not in mesh.shape:
                raise ValueError(f"sharding rule {axis!r} -> {m!r}: mesh has axes {tuple(mesh.shape)}")
            if m in used:
                raise ValueError(f"logical axes {used[m]!r} and {axis!r} of {tuple(axes)} both map to "
                                 f"mesh axis {m!r}; one mesh axis can shard one dimension only")
            used[m] = axis
        ways = int(np.prod([mesh.shape[m] for m in mesh_axes]))
        spec.append(None if not mesh_axes or size % ways else
                    mesh_axes[0] if len(mesh_axes) == 1 else mesh_axes)
    return PartitionSpec(*spec)


def logical_sharding(axes: Sequence[str | None], shape: Sequence[int], mesh: Mesh,
                     rules: Mapping[str, str | tuple[str, ...] | None] = RULES) -> NamedSharding:
    return NamedSharding(mesh, logical_to_spec(axes, shape, mesh, rules))


def param_shardings(state: nnx.State, mesh: Mesh, rules=RULES) -> nnx.State:
    """The state with each Variable's value replaced by its NamedSharding (same tree structure)."""
    def one(var: nnx.Variable) -> nnx.Variable:
        axes = var.get_metadata().get("logical_axes") or (None,) * np.ndim(var.get_value())
        return var.replace(logical_sharding(axes, np.shape(var.get_value()), mesh, rules))

    return jax.tree.map(one, state, is_leaf=lambda x: isinstance(x, nnx.Variable))


def shard_model(model_or_state, mesh: Mesh, rules=RULES):
    """Place parameters on `mesh`: a Module is updated in place and returned; a State is copied."""
    if isinstance(model_or_state, nnx.Module):
        state = nnx.state(model_or_state)
        nnx.update(model_or_state, jax.device_put(state, param_shardings(state, mesh, rules)))
        return model_or_state
    return jax.device_put(model_or_state, param_shardings(model_or_state, mesh, rules))


def cache_shardings(cache: KVCache, mesh: Mesh, rules=RULES) -> KVCache:
    """Shardings of a per-layer KVCache (k [B, Hkv, D, S], v [B, Hkv, S, D]): batch rows over
    data/fsdp, kv heads on tensor."""
    k_axes, v_axes = ("batch", "kv_heads", "head_dim", "seq"), ("batch", "kv_heads", "seq", "head_dim")
    return KVCache(k=tuple(logical_sharding(k_axes, k.shape, mesh, rules) for k in cache.k),
                   v=tuple(logical_sharding(v_axes, v.shape, mesh, rules) for v in cache.v))


def batch_sharding(mesh: Mesh, ndim: int = 2, rules=RULES) -> NamedSharding:
    """Sharding of a [B, ...] input (tokens, positions) whose batch divides data*fsdp."""
    batch = rules["batch"]
    return NamedSharding(mesh, PartitionSpec(batch, *([None] * (ndim - 1))))
