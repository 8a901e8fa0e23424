"""Reading and comparing what a generation engine produced, for the engine tests; an engine wrapper
that keeps chosen groups in flight."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import numpy as np
from flax import nnx
from jax.sharding import Mesh

from jaxrl_async.engines.base import GenerationEngine, SampleOutput, join_outputs
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


class WithholdingEngine(GenerationEngine):
    """A real engine whose pieces of the requests `withhold(request_id)` names never reach the
    reader: those groups stay in flight however fast the engine is, so that a stop or a fault
    test finds them generating (what a slow or stuck worker looks like to the controller)."""

    def __init__(self, inner: GenerationEngine, withhold: Callable[[str], bool]) -> None:
        self.inner, self.withhold = inner, withhold
        self.withheld: set[str] = set()

    async def start(self):
        await self.inner.start()

    async def stop(self):
        await self.inner.stop()

    async def submit(self, request):
        await self.inner.submit(request)

    async def abort(self, request_id):
        await self.inner.abort(request_id)

    async def update_weights(self, params, version):
        await self.inner.update_weights(params, version)

    async def stats(self):
        return await self.inner.stats()

    async def outputs(self) -> AsyncIterator[SampleOutput]:
        async for out in self.inner.outputs():
            if self.withhold(out.request_id):
                self.withheld.add(out.request_id)
                continue
            yield out
