"""cluster=ray: JAX engines as Ray actors behind one GenerationEngine, and a worker that dies.

Runs against the cluster in RAY_ADDRESS (CI: `ray start --head --num-cpus=2` in .ci/run) or a
private local one. These tests drive the proxy directly, with the loss handling the runtime does:
a lost request is regenerated (its earlier pieces discarded, like `on_group_lost(prefix_kept=False)`);
the full runs through `jaxrl_async.train cluster=ray` are in tests/jaxrl_async/test_train_ray.py.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time

import pytest

from jaxrl_async.engines.base import GenerationRequest, SamplingParams

# Keep Ray's servers on the loopback (it otherwise swaps 127.0.0.1 for the host's address).
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
ray = pytest.importorskip("ray", reason="ray is not installed (pip install -e '.[ray]')")
pytestmark = [pytest.mark.ray, pytest.mark.slow]

from jaxrl_async.cluster.ray.actor import EngineSpec  # noqa: E402
from jaxrl_async.cluster.ray.config import RayClusterConfig  # noqa: E402
from jaxrl_async.cluster.ray.connect import connect  # noqa: E402
from jaxrl_async.cluster.ray.proxy import RayEngineProxy  # noqa: E402

ADDRESS = os.environ.get("RAY_ADDRESS", "local")
SPEC = EngineSpec("jax", {"num_slots": 4, "max_len": 64, "min_bucket": 16}, "tiny")


@pytest.fixture(scope="module")
def cluster():
    connect(RayClusterConfig(address=ADDRESS))
    yield
    ray.shutdown()


def test_an_unreachable_ray_address_is_a_one_line_error():
    with pytest.raises(ConnectionError, match=r"cluster.address='127.0.0.1:1': cannot reach a Ray cluster") as err:
        connect(RayClusterConfig(address="127.0.0.1:1"))
    assert "\n" not in str(err.value)


def test_asking_for_more_gpus_than_the_cluster_has_is_a_one_line_error(cluster):
    with pytest.raises(ValueError, match=r"needs 2 GPUs; the Ray cluster has 0"):
        connect(RayClusterConfig(address=ADDRESS, num_workers=2, gpus_per_worker=1))


def _request(rid: str, n: int = 2, max_new_tokens: int = 24) -> GenerationRequest:
    return GenerationRequest(rid, [256, 1, 2, 3], SamplingParams(max_new_tokens=max_new_tokens, n=n, seed=7))


def test_two_workers_serve_requests_take_weights_and_a_killed_worker_loses_nothing(cluster):
    from flax import nnx

    from jaxrl_async.models.loading import load_model

    async def scenario():
        lost_calls: list[list[str]] = []
        done: dict[tuple[str, int], object] = {}
        proxy: RayEngineProxy | None = None

        def on_lost(ids: list[str]) -> None:
            lost_calls.append(ids)
            for rid in ids:  # regenerate: forget its pieces, resubmit with the same id
                for key in [k for k in done if k[0] == rid]:
                    del done[key]
                asyncio.get_running_loop().create_task(proxy.submit(_request(rid)))

        proxy = RayEngineProxy(SPEC, RayClusterConfig(address=ADDRESS, num_workers=2, cpus_per_worker=0.5),
                               on_lost=on_lost, poll_s=0.2)
        await proxy.start()

        async def read():
            async for out in proxy.outputs():
                if out.done:
                    assert (out.request_id, out.sample_index) not in done, "a sample was delivered twice"
                    done[(out.request_id, out.sample_index)] = out

        reader = asyncio.get_running_loop().create_task(read())

        async def wait_all(rids, timeout=120):
            async def inner():
                while not all((r, i) in done for r in rids for i in range(2)):
                    if reader.done():
                        reader.result()
                    await asyncio.sleep(0.05)
            await asyncio.wait_for(inner(), timeout)

        try:
            first = [f"a{i}" for i in range(4)]
            for rid in first:
                await proxy.submit(_request(rid))
            await wait_all(first)
            assert {o.versions[0][0] for o in done.values()} == {0}
            assert len({w.pid for w in proxy.workers}) == 2

            params = nnx.to_pure_dict(nnx.state(load_model("tiny").model, nnx.Param))
            await proxy.update_weights(params, 1)
            assert (await proxy.stats()).version == 1

            victim = proxy.workers[0]
            second = [f"b{i}" for i in range(6)]
            for rid in second:
                await proxy.submit(_request(rid, max_new_tokens=48))
            held = set(victim.live)
            os.kill(victim.pid, signal.SIGKILL)
            await wait_all(second)
            lost = {rid for call in lost_calls for rid in call}
            assert lost and lost <= held, (held, lost)  # the fault path ran, for its requests only
            assert all(o.versions == [[1, len(o.token_ids)]] for (r, _), o in done.items() if r in second)
            # Its requests went to the live worker at once; the replacement joins when it has loaded.
            for _ in range(1200):
                pids = {w.pid for w in proxy.workers if w.alive}
                if len(pids) == 2:
                    break
                await asyncio.sleep(0.1)
            assert victim.pid not in pids and len(pids) == 2, "the dead worker was not replaced"
        finally:
            await proxy.stop()
            await reader
        return lost_calls

    asyncio.run(scenario())


def test_a_critical_mark_reaches_the_ray_worker_that_holds_the_request_and_its_drafts_reach_the_trace(cluster):
    spec = EngineSpec("jax", {**SPEC.engine_config, "speculation": {
        "when": "critical", "method": "draft", "draft_model": "layers:1", "tokens": 3}}, "tiny")

    async def scenario():
        proxy = RayEngineProxy(spec, RayClusterConfig(address=ADDRESS, num_workers=1, cpus_per_worker=0.5),
                               on_lost=lambda ids: None, poll_s=0.2)
        await proxy.start()
        t0 = time.monotonic()
        try:
            await proxy.submit(_request("a", n=1, max_new_tokens=32))
            await proxy.mark_critical("a")
            async for out in proxy.outputs():
                if out.done:
                    break
            await asyncio.sleep(0.5)  # a heartbeat brings the last iteration's timing
            return t0, proxy.timings(), time.monotonic(), proxy.deadlines.p99("mark_critical")
        finally:
            await proxy.stop()

    t0, timings, t1, answered_s = asyncio.run(scenario())
    assert answered_s is not None  # the actor answered the mark
    assert sum(t.drafted for t in timings) > 0  # when=critical: only a marked request drafts
    assert {t.worker for t in timings} == {0} and all(t0 - 1 < t.t < t1 for t in timings)  # the driver's clock
