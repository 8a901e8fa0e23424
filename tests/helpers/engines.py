"""Reading and comparing what a generation engine produced, for the engine tests."""

from __future__ import annotations

import numpy as np
from flax import nnx
from jax.sharding import Mesh

from jaxrl_async.engines.base import GenerationEngine, join_outputs
from jaxrl_async.sharding import MESH_AXES


async def collect(engine: GenerationEngine, expect_done: int) -> dict:
    """Read the stream until `expect_done` samples are done; join each sample's pieces."""
    pieces: dict = {}
    done = 0
    async for out in engine.outputs():
        pieces.setdefault((out.request_id, out.sample_index), []).append(out)
        done += out.done
        if done == expect_done:
            break
    return {k: join_outputs(v) for k, v in pieces.items()}


def assert_same_samples(got: dict, want: dict) -> None:
    """Same samples (keyed by (request_id, sample_index)): tokens, versions, log-probs to 1e-5."""
    assert got.keys() == want.keys()
    for key in want:
        assert got[key].token_ids == want[key].token_ids, key
        assert got[key].versions == want[key].versions, key
        np.testing.assert_allclose(got[key].logprobs, want[key].logprobs, atol=1e-5, err_msg=str(key))


def params_of(model) -> dict:
    return nnx.to_pure_dict(nnx.state(model, nnx.Param))


def mesh_of(devices) -> Mesh:
    """One engine replica's (1, 1, T) mesh over these devices."""
    return Mesh(np.asarray(devices).reshape(1, 1, -1), MESH_AXES)
