"""`TurnEndpoint`: vLLM's token-in/token-out `/inference/v1/generate` route on loopback, over episodes.

An environment library that samples through its own client (verifiers' `TrainClient`) renders
each turn's messages to token ids itself and posts them to this route; the route hands them to
the episode's `TurnClient` (episode.py), which samples the turn on the run's engine, and answers
with exactly the sampled ids and their log-probs. So the library decides every token, and the
run trains exactly the tokens it sampled.

Routing: each episode registers under a key of its own and the library sends that key as the
request's `model` (verifiers' `ModelContext.model`; its renderer is pinned by
`renderer_model_name`, so the name drives nothing else). A `TurnClient` that refuses a turn (a
re-tokenized prefix, no room left) answers HTTP 400 to the library, which records an error; the
endpoint keeps the `EpisodeFault` so the episode ends with that fault, not the library's retelling.
A turn the engine gave up (the client raises `CancelledError`) answers 503 and marks the episode
aborted, which the task turns back into a `CancelledError` (envs/engine.py: an aborted episode).

Why an HTTP route rather than an in-process client object: verifiers builds its model client
inside its interception server from a config (`resolve_client(ClientConfig)`), so the one seam
that needs none of its private members is the endpoint that config names. The route binds
127.0.0.1 only; nothing leaves the host.

Sampling knobs in the request (`temperature`, `top_p`, ...) are the run's to set, not the
environment's: the engine samples with the run's settings and this route reads only
`max_tokens` (the turn's limit). `stop_token_ids` are the renderer's; the engine stops on the
tokenizer's own stop tokens, which for a chat model are the same end-of-turn tokens.
"""

from __future__ import annotations

import asyncio
import secrets
from dataclasses import dataclass, field
from typing import Any

from jaxrl_async.envs.episode import EpisodeFault, TurnClient


@dataclass
class _Route:
    client: TurnClient
    fault: EpisodeFault | None = None
    aborted: bool = False  # the engine gave a turn up (the client raised CancelledError)
    calls: int = 0
    sent: list[list[int]] = field(default_factory=list)  # the token ids of each call, as the library sent them


class TurnEndpoint:
    """The route and its per-episode clients. `start()` on the loop the episodes run on."""

    def __init__(self) -> None:
        self._routes: dict[str, _Route] = {}
        self._runner: Any = None
        self.base_url = ""  # http://127.0.0.1:<port>/v1 once started

    async def start(self) -> None:
        from aiohttp import web

        app = web.Application(client_max_size=256 * 1024 * 1024)  # a long context is a large JSON body
        app.router.add_post("/inference/v1/generate", self._generate)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = self._runner.addresses[0][1]
        self.base_url = f"http://127.0.0.1:{port}/v1"

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    def open(self, client: TurnClient) -> str:
        """Register an episode's client; returns the key the library sends as `model`."""
        key = f"episode-{secrets.token_hex(8)}"
        self._routes[key] = _Route(client)
        return key

    def close(self, key: str) -> _Route:
        """Unregister an episode; its record (fault, calls, what was sent) is returned."""
        return self._routes.pop(key)

    async def _generate(self, request: Any) -> Any:
        from aiohttp import web

        body = await request.json()
        route = self._routes.get(body.get("model"))
        if route is None:
            return web.json_response({"error": f"no episode {body.get('model')!r} is open"}, status=404)
        token_ids = body.get("token_ids")
        if not isinstance(token_ids, list) or not all(isinstance(t, int) for t in token_ids):
            return web.json_response({"error": "token_ids must be a list of ints"}, status=400)
        max_tokens = (body.get("sampling_params") or {}).get("max_tokens")
        route.calls += 1
        route.sent.append(list(token_ids))
        try:
            turn = await route.client.generate(token_ids, max_new_tokens=max_tokens)
        except EpisodeFault as fault:
            route.fault = route.fault or fault
            return web.json_response({"error": str(fault)}, status=400)
        except asyncio.CancelledError:
            if asyncio.current_task().cancelling():  # this handler itself is cancelled: let it end
                raise
            route.aborted = True  # the engine gave the turn up: the episode is aborted, not failed
            return web.json_response({"error": "the engine aborted the turn"}, status=503)
        return web.json_response(generate_response(turn.token_ids, turn.logprobs, turn.finish_reason))


def generate_response(token_ids: list[int], logprobs: list[float], finish_reason: str) -> dict[str, Any]:
    """vLLM's `/inference/v1/generate` answer for one sample (what `renderers.client.generate` reads)."""
    return {
        "request_id": "",
        "choices": [{
            "index": 0,
            "token_ids": list(token_ids),
            "logprobs": {"content": [{"token": f"token_id:{t}", "logprob": float(lp)}
                                     for t, lp in zip(token_ids, logprobs, strict=True)]},
            "finish_reason": finish_reason,
        }],
    }
