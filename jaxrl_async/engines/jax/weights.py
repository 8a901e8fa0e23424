"""Check new weights against the engine's before accepting them.

A trainer that pushes weights with a renamed leaf, a transposed kernel or a float32 copy of
bfloat16 weights would otherwise be caught only by a recompilation or, worse, silently produce
garbage. The check (`jaxrl_async.trees.check_like`) names the first leaf that differs.
"""

from __future__ import annotations

from typing import Any

import jax

from jaxrl_async.trees import check_like, pure


def accept_params(reference: Any, incoming: Any) -> dict:
    """Check `incoming` against `reference`; return it as a pure dict on the reference's devices.

    Both are an `nnx.State` or the nested dict of arrays `nnx.to_pure_dict` gives; the
    reference's leaves may be `jax.ShapeDtypeStruct`s (shape, dtype and sharding are all it
    needs). The arrays are not copied when already in place: the caller copies them into its own
    layout (the engine's `inference_weights`). Raises a one-line ValueError (`TreeMismatch`)
    naming the first missing, unexpected, mis-shaped or mis-typed leaf as `params/...`.
    """
    reference, incoming = pure(reference), pure(incoming)
    check_like({"params": reference}, {"params": incoming}, "the pushed weights")
    return jax.tree.map(lambda x, r: jax.device_put(x, r.sharding), incoming, reference)
