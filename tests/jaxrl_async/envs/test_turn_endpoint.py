"""TurnEndpoint: vLLM's generate route on loopback, each request routed to its episode's TurnClient."""

import asyncio

import pytest

aiohttp = pytest.importorskip("aiohttp", reason='the turn endpoint needs aiohttp: pip install -e ".[envs]"')

from jaxrl_async.envs.episode import EpisodeFault, Turn  # noqa: E402
from jaxrl_async.envs.turn_endpoint import TurnEndpoint  # noqa: E402


class Echo:
    """Samples the last token, then the next id; refuses a sequence that does not start with 1."""

    async def generate(self, token_ids, *, max_new_tokens=None):
        if token_ids[0] != 1:
            raise EpisodeFault("prefix_mismatch", "not ours")
        finish = "length" if max_new_tokens == 2 else "stop"
        return Turn([token_ids[-1], token_ids[-1] + 1], [-0.5, -0.25], [[0, 2]], finish)


def serve(calls):
    """Start an endpoint with one episode open, run `calls(post, key)`, return (its results, the route)."""

    async def main():
        endpoint = TurnEndpoint()
        await endpoint.start()
        key = endpoint.open(Echo())
        try:
            async with aiohttp.ClientSession() as session:
                async def post(body):
                    url = endpoint.base_url.removesuffix("/v1") + "/inference/v1/generate"
                    async with session.post(url, json=body) as r:
                        return r.status, await r.json()

                return await calls(post, key), endpoint.close(key)
        finally:
            await endpoint.stop()

    return asyncio.run(main())


def test_a_turn_answers_with_exactly_the_sampled_ids_and_their_logprobs():
    async def calls(post, key):
        return await post({"model": key, "token_ids": [1, 7], "sampling_params": {"max_tokens": 2, "temperature": 0.3}})

    (status, body), route = serve(calls)
    assert status == 200
    choice = body["choices"][0]
    assert choice["token_ids"] == [7, 8] and choice["finish_reason"] == "length"
    assert choice["logprobs"]["content"] == [{"token": "token_id:7", "logprob": -0.5},
                                             {"token": "token_id:8", "logprob": -0.25}]
    assert (route.calls, route.sent, route.fault) == (1, [[1, 7]], None)


def test_a_refused_turn_is_a_400_and_the_episode_keeps_the_fault():
    async def calls(post, key):
        return [await post({"model": key, "token_ids": [2, 3]}),
                await post({"model": "episode-none", "token_ids": [1]}),
                await post({"model": key, "token_ids": "1 2"})]

    (refused, unknown, malformed), route = serve(calls)
    assert refused[0] == 400 and "prefix_mismatch" in refused[1]["error"]
    assert unknown[0] == 404 and malformed[0] == 400
    assert route.fault.kind == "prefix_mismatch" and route.calls == 1
