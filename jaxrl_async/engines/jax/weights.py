"""Check new weights against the engine's before accepting them.

A trainer that pushes weights with a renamed leaf, a transposed kernel or a float32 copy of
bfloat16 weights would otherwise be caught only by a recompilation or, worse, silently produce
garbage. The check names the first leaf that differs.
"""

from __future__ import annotations

from typing import Any

import jax
from flax import nnx


def _pure(tree: Any) -> Any:
    return nnx.to_pure_dict(tree) if isinstance(tree, nnx.State) else tree


def _leaves(tree: Any) -> dict[str, Any]:
    return {jax.tree_util.keystr(path): leaf
            for path, leaf in jax.tree_util.tree_flatten_with_path(_pure(tree))[0]}


def accept_params(reference: Any, incoming: Any) -> dict:
    """Check `incoming` against `reference`; return it as a pure dict on the reference's devices.

    Both are an `nnx.State` or the nested dict of arrays `nnx.to_pure_dict` gives; the
    reference's leaves may be `jax.ShapeDtypeStruct`s (shape, dtype and sharding are all it
    needs). The arrays are not copied when already in place: the caller copies them into its own
    layout (the engine's `inference_weights`). Raises a one-line ValueError naming the first
    missing, unexpected, mis-shaped or mis-typed leaf.
    """
    ref, new = _leaves(reference), _leaves(incoming)
    missing = [k for k in ref if k not in new]
    if missing:
        raise ValueError(f"update_weights: leaf params{missing[0]} is missing ({len(missing)} missing in all)")
    extra = [k for k in new if k not in ref]
    if extra:
        raise ValueError(f"update_weights: unexpected leaf params{extra[0]} ({len(extra)} unexpected in all)")
    for key, want in ref.items():
        got = new[key]
        shape, dtype = tuple(getattr(got, "shape", ())), getattr(got, "dtype", type(got))
        if shape != want.shape or dtype != want.dtype:
            raise ValueError(
                f"update_weights: leaf params{key} has shape {shape} dtype {dtype}; "
                f"the engine's is shape {want.shape} dtype {want.dtype}")
    return jax.tree.map(lambda x, r: jax.device_put(x, r.sharding), _pure(incoming), _pure(reference))
