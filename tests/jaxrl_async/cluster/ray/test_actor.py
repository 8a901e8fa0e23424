"""The worker side of cluster=ray (cluster/ray/actor.py), in-process: an `EngineActor` is a plain
object that Ray hosts, so its contract with its engine is tested without Ray."""

from __future__ import annotations

import asyncio

from jaxrl_async.cluster.ray.actor import EngineActor, EngineSpec
from jaxrl_async.engines.base import GenerationRequest, SamplingParams

SPECULATE_CRITICAL = {"when": "critical", "method": "draft", "draft_model": "layers:1", "tokens": 3}


def test_an_actor_forwards_a_critical_mark_to_its_engine_whose_drafts_its_polls_report():
    spec = EngineSpec("jax", {"num_slots": 4, "max_len": 64, "min_bucket": 16, "speculation": SPECULATE_CRITICAL},
                      "tiny")
    requests = [GenerationRequest(rid, [1, 2, 3], SamplingParams(24, temperature=0.0)) for rid in ("a", "b")]

    async def main():
        actor = EngineActor(spec)
        await actor.start()
        for r in requests:
            await actor.submit(r)
        await actor.mark_critical("b")
        await actor.mark_critical("unknown")  # ignored, as the engine ignores it
        tokens: dict[str, list[int]] = {"a": [], "b": []}
        finished: set[str] = set()
        timings = []
        while len(finished) < 2:
            answer = await asyncio.wait_for(actor.poll(1.0), 300)
            timings += answer.timings  # the poll carries the engine's timings (the proxy traces them)
            for out in answer.outputs:
                tokens[out.request_id] += out.token_ids
                if out.done:
                    finished.add(out.request_id)
        timings += (await actor.poll(0.0)).timings
        await actor.stop()
        return tokens, timings

    tokens, timings = asyncio.run(main())
    assert sum(t.drafted for t in timings) > 0  # when=critical: only a marked request drafts
    assert tokens["a"] == tokens["b"]  # greedy: speculation changes no token
