"""Reading and comparing what a generation engine produced, for the engine tests; real engines
seen through a fault (`WrappedEngine` and its subclasses: a stuck request, a slow one, groups
withheld so that they stay in flight)."""

from __future__ import annotations

from collections.abc import Callable

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


class WrappedEngine(GenerationEngine):
    """A real engine seen through a fault: every call goes to `inner`; subclasses change the
    output stream (`keep`) the way a broken engine would."""

    def __init__(self, inner: GenerationEngine) -> None:
        self.inner = inner

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

    def keep(self, out) -> bool:
        """Whether the controller sees this piece."""
        return True

    async def outputs(self):
        async for out in self.inner.outputs():
            if self.keep(out):
                yield out


class SilentRequestEngine(WrappedEngine):
    """Never returns request `request_id` after its first `after` pieces (a rollout stuck in the
    engine); `swallowed` counts the pieces held back. `request_id` None: every request after the
    engine's first `after` pieces (a wholly hung engine)."""

    def __init__(self, inner: GenerationEngine, request_id: str | None, after: int = 0) -> None:
        super().__init__(inner)
        self.request_id, self.after = request_id, after
        self.seen = 0
        self.swallowed = 0

    def keep(self, out) -> bool:
        if self.request_id is not None and out.request_id != self.request_id:
            return True
        self.seen += 1
        if self.seen <= self.after:
            return True
        self.swallowed += 1
        return False


class SlowRequestEngine(WrappedEngine):
    """Streams request `request_id` slowly: `delay_s` before each of its pieces (a long rollout
    that makes steady progress); `pieces` counts them."""

    def __init__(self, inner: GenerationEngine, request_id: str, delay_s: float) -> None:
        super().__init__(inner)
        self.request_id, self.delay_s = request_id, delay_s
        self.pieces = 0

    async def outputs(self):
        import asyncio

        async for out in self.inner.outputs():
            if out.request_id == self.request_id:
                self.pieces += 1
                await asyncio.sleep(self.delay_s)
            yield out


class WithholdingEngine(WrappedEngine):
    """A real engine whose pieces of the requests `withhold(request_id)` names never reach the
    reader: those groups stay in flight however fast the engine is, so that a stop or a fault
    test finds them generating (what a slow or stuck worker looks like to the controller)."""

    def __init__(self, inner: GenerationEngine, withhold: Callable[[str], bool]) -> None:
        super().__init__(inner)
        self.withhold = withhold
        self.withheld: set[str] = set()

    def keep(self, out: SampleOutput) -> bool:
        if self.withhold(out.request_id):
            self.withheld.add(out.request_id)
            return False
        return True
