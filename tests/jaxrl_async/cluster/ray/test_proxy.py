"""RayEngineProxy's routing and per-worker liveness, on fake actors (tests/helpers/fake_ray.py), no Ray needed.

One worker stops answering (SIGSTOP): it is declared lost from its own missed deadline while
the healthy worker's results keep flowing, stats and weight pushes never wait on it, and new
requests go to the healthy one. The real-process case is tests/faults/test_ray_faults.py.
"""

from __future__ import annotations

import asyncio
import logging
import time

import pytest

from jaxrl_async.cluster.ray.actor import EngineSpec
from jaxrl_async.cluster.ray.config import RayClusterConfig
from jaxrl_async.cluster.ray.proxy import RayEngineProxy
from jaxrl_async.engines.base import GenerationRequest, SamplingParams
from tests.helpers.fake_ray import FakeActors

SPEC = EngineSpec("jax", {}, "tiny")
POLL_S = 0.02
FLOOR_S = 1.0  # the deadline a fast fake worker gets: 20 x p99 is far below it


def _cluster(**kw) -> RayClusterConfig:
    kw = {"num_workers": 2, "rpc_timeout_floor_s": FLOOR_S, "rpc_timeout_ceiling_s": 5, **kw}
    return RayClusterConfig(address="local", **kw)


def _request(rid: str) -> GenerationRequest:
    return GenerationRequest(rid, [1, 2], SamplingParams(max_new_tokens=4, n=2, seed=0))


async def _started(actors: FakeActors, lost: list[list[str]], **kw) -> RayEngineProxy:
    proxy = RayEngineProxy(SPEC, _cluster(**kw), on_lost=lost.append, poll_s=POLL_S, actors=actors)
    await proxy.start()
    return proxy


def test_a_stopped_worker_is_lost_at_its_own_deadline_while_the_healthy_ones_results_keep_flowing():
    async def scenario():
        actors, lost = FakeActors(), []
        proxy = await _started(actors, lost)
        done: list[tuple[str, float]] = []

        async def read():
            async for out in proxy.outputs():
                if out.done:
                    done.append((out.request_id, time.monotonic()))

        reader = asyncio.get_running_loop().create_task(read())
        for i in range(20):  # the poll deadline learns the fakes' answer times
            await proxy.submit(_request(f"warm{i}"))
        await asyncio.sleep(0.3)
        healthy, stuck = proxy.workers
        stuck.live.add("held")  # a request it holds when it stops (its answer never comes)
        stuck.actor.freeze()
        t_stop = time.monotonic()
        deadline_s = proxy.deadlines.timeout_s("poll")  # learned from the answers so far
        i = 0
        while stuck.alive and time.monotonic() - t_stop < 10:
            await proxy.submit(_request(f"r{i}"))  # never waits on the stopped worker
            i += 1
            await asyncio.sleep(0.05)
        found_s = time.monotonic() - t_stop
        during = [rid for rid, t in done if t_stop < t < t_stop + found_s and rid.startswith("r")]
        killed = (stuck.actor.killed, healthy.actor.killed)
        await proxy.stop()
        reader.cancel()
        return found_s, deadline_s, during, lost, killed, actors

    found_s, deadline_s, during, lost, killed, actors = asyncio.run(scenario())
    assert FLOOR_S <= deadline_s < 5  # learned (20 x p99, at least the floor), not the 5 s ceiling
    assert FLOOR_S * 0.9 < found_s < POLL_S + deadline_s + 1, (found_s, deadline_s)  # its own deadline
    assert len(during) >= 10, during  # the healthy worker served throughout the stall
    assert any("held" in c for c in lost)  # its requests went to the fault path
    assert killed == (True, False)
    assert len(actors.spawned) == 3  # the stopped worker was replaced


def test_stats_and_a_weight_push_do_not_wait_for_a_stopped_worker():
    async def scenario():
        actors, lost = FakeActors(), []
        proxy = await _started(actors, lost, rpc_timeout_floor_s=4)  # lost after 4 s
        await proxy.update_weights({"w": 1}, 1)
        await asyncio.sleep(0.2)  # a few heartbeats
        healthy, stuck = proxy.workers
        stuck.actor.freeze()
        t0 = time.monotonic()
        stats = await proxy.stats()
        stats_s = time.monotonic() - t0
        await asyncio.sleep(0.1)
        t0 = time.monotonic()
        await proxy.update_weights({"w": 2}, 2)
        push_s = time.monotonic() - t0
        stuck_alive_after_push = stuck.alive
        await proxy.submit(_request("after"))
        routed = proxy.worker_of("after")
        await proxy.stop()
        return stats, stats_s, push_s, stuck_alive_after_push, routed, healthy, stuck

    stats, stats_s, push_s, stuck_alive_after_push, routed, healthy, stuck = asyncio.run(scenario())
    assert stats_s < 0.05 and stats.extra["workers"] == 2 and stats.version == 1
    # The push waited for the healthy worker, and for the stopped one 3x the healthy answer time
    # (at least 1 s), not its deadline (4 s); the stopped one is still alive then, only behind.
    assert healthy.actor.version == 2 and stuck.actor.version == 1
    assert 1.0 <= push_s < 2 and stuck_alive_after_push, push_s
    assert routed == healthy.index  # a worker behind on weights gets no new request


def test_a_worker_that_hangs_at_the_runs_end_is_named_and_killed_by_stop(caplog):
    async def scenario():
        actors = FakeActors()
        proxy = await _started(actors, [], rpc_timeout_floor_s=0.3)
        await asyncio.sleep(0.1)  # a few heartbeats
        healthy, stuck = proxy.workers
        stuck.actor.freeze()
        t0 = time.monotonic()
        await proxy.stop()
        return time.monotonic() - t0, healthy, stuck

    caplog.set_level(logging.WARNING, logger="jaxrl_async.cluster.ray")
    stop_s, healthy, stuck = asyncio.run(scenario())
    named = [r.getMessage() for r in caplog.records if "did not answer stop" in r.getMessage()]
    assert len(named) == 1 and f"(pid {stuck.pid})" in named[0], named
    assert stuck.actor.killed and healthy.actor.killed
    assert stop_s < 1.5, stop_s  # within the floor, not the 5 s ceiling


def test_a_push_waits_for_every_worker_that_answers():
    async def scenario():
        actors = FakeActors(latency_s=0.05)
        proxy = await _started(actors, [])
        await proxy.update_weights({"w": 1}, 1)
        versions = [w.actor.version for w in proxy.workers]
        await proxy.stop()
        return versions

    assert asyncio.run(scenario()) == [1, 1]


def test_the_poll_deadline_follows_the_observed_latency_and_an_explicit_rpc_timeout_overrides_it():
    async def scenario(**kw):
        actors = FakeActors(latency_s=0.1)
        proxy = await _started(actors, [], **kw)
        await asyncio.sleep(0.5)
        await proxy.stop()
        return proxy.deadlines

    learned = asyncio.run(scenario())
    assert learned.p99("poll") == pytest.approx(0.1, abs=0.05)
    assert learned.timeout_s("poll") == pytest.approx(20 * learned.p99("poll"))  # above the 1 s floor
    assert asyncio.run(scenario(rpc_timeout_s=3)).timeout_s("poll") == 3


def test_a_refused_submit_ends_the_output_stream_with_the_workers_one_line_error():
    class Refusing(FakeActors):
        def spawn(self, index):
            actor = super().spawn(index)

            async def refuse(request):
                raise ValueError(f"request {request.request_id!r}: prompt of 70 tokens + max_new_tokens=24 = 94 "
                                 "exceeds engine.max_len=64")

            actor.do_submit = refuse
            return actor

    async def scenario():
        proxy = await _started(Refusing(), [])
        await proxy.submit(_request("long"))  # returns: the caller never waits on a worker
        try:
            async for _ in proxy.outputs():
                pass
        finally:
            await proxy.stop()

    with pytest.raises(ValueError, match=r"^request 'long': prompt of 70 tokens .* engine.max_len=64$"):
        asyncio.run(scenario())


def test_a_submit_to_a_worker_that_just_stopped_returns_at_once_and_the_request_goes_to_the_fault_path():
    async def scenario():
        actors, lost = FakeActors(), []
        proxy = await _started(actors, lost, num_workers=1)
        await asyncio.sleep(0.1)
        (stuck,) = proxy.workers
        stuck.actor.freeze()  # not late yet: the request is routed to it
        t0 = time.monotonic()
        await proxy.submit(_request("x"))
        submit_s = time.monotonic() - t0
        while stuck.alive:
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.1)
        await proxy.stop()
        return submit_s, lost

    submit_s, lost = asyncio.run(scenario())
    assert submit_s < 0.1, submit_s  # the caller (the controller's lock) never waits on a worker
    assert lost == [["x"]]


def test_a_critical_mark_goes_to_the_worker_that_holds_the_request_after_its_submit():
    async def scenario():
        actors = FakeActors(latency_s=0.01)
        proxy = await _started(actors, [])
        for rid in ("a", "b"):
            await proxy.submit(_request(rid))
            await proxy.mark_critical(rid)  # before the submit's answer: sent after it
        await proxy.mark_critical("unknown")  # an unknown (or finished) id is ignored
        owners = {rid: proxy.worker_of(rid) for rid in ("a", "b")}
        await asyncio.sleep(0.2)
        await proxy.stop()
        return owners, {w.index: w.actor for w in proxy.workers}

    owners, actors = asyncio.run(scenario())
    assert owners["a"] != owners["b"]  # least-loaded routing spread them
    for rid, index in owners.items():
        actor = actors[index]
        assert actor.critical == [rid]  # only the owner got it, once
        assert actor.calls.index("submit") < actor.calls.index("mark_critical")


def test_the_workers_timings_reach_the_run_tagged_by_worker_and_on_the_drivers_clock():
    async def scenario():
        actors = FakeActors(clock_offset_s=1e6)  # another node's monotonic clock
        proxy = await _started(actors, [])
        t0 = time.monotonic()
        for i in range(6):
            await proxy.submit(_request(f"r{i}"))
        await asyncio.sleep(0.3)
        timings, again = proxy.timings(), proxy.timings()
        t1 = time.monotonic()
        await proxy.stop()
        return t0, t1, timings, again

    t0, t1, timings, again = asyncio.run(scenario())
    assert sum(t.tokens for t in timings) == 12 and again == []  # 6 requests x 2 samples, read once
    assert {t.worker for t in timings} == {0, 1}
    assert all(t0 - 0.01 < t.t < t1 for t in timings), [t.t for t in timings]  # not 1e6 s away
    assert [t.t for t in timings] == sorted(t.t for t in timings)
