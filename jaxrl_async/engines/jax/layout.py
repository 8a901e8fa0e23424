"""The JAX engine's device layout: its jitted steps, its weights' shardings, and pushed weights
moved onto it device to device.

Without a mesh every engine shares the module-level `SHARED_STEPS` (one compilation per shape,
process-wide). With a mesh (a tensor-parallel replica, jaxrl_async/cluster/placement.py) a core
gets `mesh_steps` whose outputs keep the cache and weights in the sharding table's layout, and
pushed weights are first regrouped on the trainer's own devices (`regroup_for`) so that the move
onto the engine's devices never goes through the host.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from jaxrl_async.engines.jax import steps
from jaxrl_async.models.attention import KVCache
from jaxrl_async.models.lora import LoraAdapter, merge_layers
from jaxrl_async.models.transformer import inference_weights


def generation_copy(params: dict) -> dict:
    # New arrays (jnp.copy), so a caller may donate or delete the weights it pushed.
    return jax.tree.map(jnp.copy, inference_weights(params))


def merge_adapter(base: dict, adapter: LoraAdapter) -> dict:
    """Generation-layout weights `base` with a stacked LoRA adapter merged into each layer
    (models/lora.py `merge_layers`); leaves without an adapter are the base's own arrays."""
    layers = tuple(merge_layers(layer, jax.tree.map(lambda x, i=i: x[i], adapter.params["layers"]), adapter.scale)
                   for i, layer in enumerate(base["layers"]))
    return {**base, "layers": layers}


@dataclass(frozen=True)
class Steps:
    """The jitted functions one core calls: the shared module-level ones, or its mesh's own."""

    prefill: Callable
    copy_prefix: Callable
    decode: Callable  # steps.engine_decode_steps
    install: Callable  # checked params -> the engine's own generation-layout copy
    merge: Callable  # (base generation weights, LoraAdapter) -> merged generation weights
    prefill_paged: Callable  # the paged cache's (page_size > 0)
    copy_page: Callable
    read_pages: Callable
    write_pages: Callable


SHARED_STEPS = Steps(
    prefill=jax.jit(steps.engine_prefill, static_argnums=0, donate_argnums=2),
    copy_prefix=jax.jit(steps.engine_copy_prefix, static_argnums=3, donate_argnums=0),
    decode=jax.jit(steps.engine_decode_steps, static_argnums=(0, 1, 2), static_argnames="kernel",
                   donate_argnums=4),
    install=jax.jit(generation_copy),
    merge=jax.jit(merge_adapter),
    prefill_paged=jax.jit(steps.engine_prefill_paged, static_argnums=0, donate_argnums=2),
    copy_page=jax.jit(steps.engine_copy_page, donate_argnums=0),
    read_pages=jax.jit(steps.engine_read_pages),
    write_pages=jax.jit(steps.engine_write_pages, donate_argnums=0))


def mesh_steps(mesh: Mesh, cache: KVCache, weights: dict) -> Steps:
    """Steps that return the cache (and install the weights) in exactly these shardings.

    Left to propagation, XLA picks the output layouts itself: on a (1, 1, 2) mesh it hands the
    cache back as P(None, 'tensor') for P(('data', 'fsdp'), 'tensor', None, None) and installs
    weights in a layout of its own choosing. Whether the next call then reuses its executable
    depends on jax finding the two layouts equivalent; with fixed output shardings every call
    gets exactly the first call's input layouts, and the weights keep the table's layout.
    """
    replicated = NamedSharding(mesh, PartitionSpec())
    return Steps(
        prefill=jax.jit(steps.engine_prefill, static_argnums=0, donate_argnums=2, out_shardings=cache),
        copy_prefix=jax.jit(steps.engine_copy_prefix, static_argnums=3, donate_argnums=0,
                            out_shardings=cache),
        decode=jax.jit(steps.engine_decode_steps, static_argnums=(0, 1, 2), static_argnames="kernel",
                       donate_argnums=4, out_shardings=(cache, replicated, replicated, replicated, replicated)),
        install=jax.jit(generation_copy, out_shardings=weights),
        merge=jax.jit(merge_adapter, out_shardings=weights),
        prefill_paged=jax.jit(steps.engine_prefill_paged, static_argnums=0, donate_argnums=2,
                              out_shardings=cache),
        copy_page=jax.jit(steps.engine_copy_page, donate_argnums=0, out_shardings=cache),
        read_pages=jax.jit(steps.engine_read_pages),
        write_pages=jax.jit(steps.engine_write_pages, donate_argnums=0, out_shardings=cache))


def generation_shardings(params: dict) -> dict:
    """`inference_weights` applied to the params' shardings: layer i of a stacked parameter is
    sharded like the stack without its leading `layers` axis, which the table never shards."""
    def one_layer(s: NamedSharding) -> NamedSharding:
        if len(s.spec) and s.spec[0] is not None:
            raise ValueError(f"sharding {s.spec}: the leading layers axis must not be sharded")
        return NamedSharding(s.mesh, PartitionSpec(*s.spec[1:]))

    num_layers = next(iter(params["layers"].values())).shape[0]
    out = {name: ref.sharding for name, ref in params.items() if name != "layers"}
    out["layers"] = tuple({name: one_layer(ref.sharding) for name, ref in params["layers"].items()}
                          for _ in range(num_layers))
    return out


def _blocks(sharding: jax.sharding.Sharding, shape: tuple[int, ...]) -> set[tuple]:
    """The distinct index blocks of an array of `shape` under `sharding`, as hashable tuples."""
    return {tuple(index.indices(size) for index, size in zip(block, shape))
            for block in sharding.devices_indices_map(shape).values()}


@functools.lru_cache(maxsize=None)
def _reshard(sharding: NamedSharding) -> Callable:
    return jax.jit(lambda x: x, out_shardings=sharding)


def regroup_for(x: Any, target: NamedSharding) -> Any:
    """`x`, resharded on its own devices so that `jax.device_put(x, target)` copies device buffers.

    `device_put` onto another layout copies device to device only when every block of the
    target already exists as a shard of the source (or the source is one device); otherwise it
    reads the whole array back to the host and uploads it again. A trainer's fsdp x tensor layout
    is regrouped here, on its own devices (one collective), into the target's blocks, each
    replicated over the spare devices. Returned as is: host data (uploaded anyway), arrays of
    another process, a one-device source, blocks already in place, and a source whose device
    count the target's block count does not divide (that one still goes through the host).
    """
    if not isinstance(x, jax.Array) or not x.is_fully_addressable or len(x.sharding.device_set) == 1:
        return x
    shape = tuple(x.shape)
    if _blocks(target, shape) <= _blocks(x.sharding, shape):
        return x
    if x.sharding.device_set == target.device_set:
        return _reshard(target)(x)
    mesh = target.mesh
    used = {a for entry in target.spec if entry is not None
            for a in ((entry,) if isinstance(entry, str) else entry)}
    sizes = [mesh.shape[a] if a in used else 1 for a in mesh.axis_names]
    devices = sorted(x.sharding.device_set, key=lambda d: d.id)
    copies, rest = divmod(len(devices), int(np.prod(sizes)))
    if rest:
        return x
    source_mesh = Mesh(np.asarray(devices).reshape(copies, *sizes), ("copies", *mesh.axis_names))
    return _reshard(NamedSharding(source_mesh, target.spec))(x)


def regrouped(params: Any, reference: dict) -> Any:
    """`regroup_for` on each leaf that matches its reference leaf (`accept_params` names the rest)."""
    pure = nnx.to_pure_dict(params) if isinstance(params, nnx.State) else params
    refs = {jax.tree_util.keystr(path): ref
            for path, ref in jax.tree_util.tree_flatten_with_path(reference)[0]}

    def one(path, x):
        ref = refs.get(jax.tree_util.keystr(path))
        matches = (ref is not None and tuple(getattr(x, "shape", ())) == ref.shape
                   and getattr(x, "dtype", None) == ref.dtype)
        return regroup_for(x, ref.sharding) if matches else x

    return jax.tree_util.tree_map_with_path(one, pure)
