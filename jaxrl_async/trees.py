"""Parameter trees: the one check that a tree fits another, and the one float cast.

Every place that takes a tree of arrays from somewhere else — weights pushed into the JAX or
the vLLM engine, a trainer state restored from a checkpoint, HF tensors on their way into vLLM —
checks it against the tree it replaces with `check_like` before writing anything: a renamed
leaf, a transposed kernel or a float32 copy of bfloat16 weights would otherwise surface as a
recompilation, a tree diff from deep inside orbax or, worse, silent garbage.

Paths are written `a/b/c` (dict keys, sequence indices and attribute names joined by `/`:
`params/layers/wq`, `opt_state/0/mu/embed`), the form `models/hf_weights.py` uses for parameter
paths; a leaf is written `dtype[shape]` (`float32[2, 128, 64]`).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx


class TreeMismatch(ValueError):
    """A tree does not fit its reference: one line naming the first differing path."""


def path_str(path: tuple[Any, ...]) -> str:
    """A `jax.tree_util` key path as `a/b/c`."""
    return "/".join(str(getattr(k, "key", getattr(k, "idx", getattr(k, "name", k)))) for k in path)


def pure(tree: Any) -> Any:
    """`tree` with every `nnx.State` in it replaced by its nested dict of arrays."""
    return jax.tree.map(lambda s: nnx.to_pure_dict(s) if isinstance(s, nnx.State) else s, tree,
                        is_leaf=lambda s: isinstance(s, nnx.State))


def leaves_by_path(tree: Any) -> dict[str, Any]:
    """{`a/b/c` path: leaf} of `tree` (an `nnx.State` counts as its pure dict)."""
    return {path_str(p): leaf for p, leaf in jax.tree_util.tree_flatten_with_path(pure(tree))[0]}


def _spec(leaf: Any) -> tuple[tuple[int, ...], np.dtype]:
    """(shape, dtype) of an array, a `jax.ShapeDtypeStruct`, orbax's array metadata or a scalar."""
    shape, dtype = getattr(leaf, "shape", None), getattr(leaf, "dtype", None)
    if shape is None or dtype is None:
        array = np.asarray(leaf)
        shape, dtype = array.shape, array.dtype
    return tuple(shape), np.dtype(dtype)


def _describe(spec: tuple[tuple[int, ...], np.dtype]) -> str:
    return f"{spec[1]}{list(spec[0])}"


def _order(path: str) -> tuple[int, str]:
    # Shallowest first: a model's own arrays (`params/...`) come before the optimizer's copies
    # of them (`opt_state/0/mu/...`); they are what the user recognises.
    return path.count("/"), path


def check_like(reference: Any, incoming: Any, what: str) -> None:
    """Raise `TreeMismatch` unless `incoming` has `reference`'s paths and, at every path, its
    leaf's shape and dtype; silent when it fits.

    Both trees are nested dicts / sequences / `nnx.State`s of arrays; the reference's leaves may
    be `jax.ShapeDtypeStruct`s (only shape and dtype are read). `what` names `incoming` in the
    message ("the pushed weights", "the checkpoint"). The first problem found is reported: a
    missing path, else an unexpected one, else a differing shape or dtype (shallowest path
    first; a missing or unexpected path with the count when there are several), e.g.
    `params/embed is float32[2, 2] in the pushed weights; expected float32[256, 64]`.
    """
    want, got = leaves_by_path(reference), leaves_by_path(incoming)
    missing = sorted(want.keys() - got.keys(), key=_order)
    if missing:
        raise TreeMismatch(f"{missing[0]} ({_describe(_spec(want[missing[0]]))}) is missing from {what}"
                           + _also(len(missing), "missing"))
    extra = sorted(got.keys() - want.keys(), key=_order)
    if extra:
        raise TreeMismatch(f"{extra[0]} ({_describe(_spec(got[extra[0]]))}) in {what} is unexpected"
                           + _also(len(extra), "unexpected"))
    differ = sorted((p for p in want if _spec(got[p]) != _spec(want[p])), key=_order)
    if differ:
        p = differ[0]
        raise TreeMismatch(f"{p} is {_describe(_spec(got[p]))} in {what}; expected {_describe(_spec(want[p]))}")


def _also(count: int, kind: str) -> str:
    return f" ({count} {kind} in all)" if count > 1 else ""


def cast_floats(tree: Any, dtype: Any) -> Any:
    """`tree` with every floating-point leaf cast to `dtype` (`astype`); other leaves as they are.
    The one cast between the trainer's float32 params and a compute, engine or export dtype."""
    dtype = jnp.dtype(dtype)
    return jax.tree.map(lambda x: x.astype(dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x, tree)
