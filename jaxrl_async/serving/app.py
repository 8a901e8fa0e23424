"""The HTTP server: a FastAPI app over one `EngineClient` (`python -m jaxrl_async.serve` runs it
under uvicorn; cli/serve.py).

Routes:
  POST /inference/v1/generate   token ids in, token ids + log-probs + versions out (tokens.py)
  POST /v1/chat/completions     OpenAI chat completions, non-streaming (chat.py)
  GET  /v1/models               the served model, with vLLM's `max_model_len` (the context)
  GET  /health                  200 with the client's counts while the engine runs, 503 once dead

Errors are vLLM's (and OpenAI's) JSON, `{"error": {"message", "type", "param", "code"}}`, with a
one-line message that names the offending key: 400 for a bad request, 404 for another model,
503 when the engine stopped or died. A client that disconnects before its reply aborts its
request in the engine (`EngineClient.generate` is cancelled), so its slots free at once.

`serve` runs the app under uvicorn with the engine started on the server's event loop before the
first request and stopped after the last, also when uvicorn skips its own shutdown steps (a
second Ctrl-C). FastAPI and uvicorn (the `serve` extra) are imported here only.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import Awaitable, Callable
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from jaxrl_async.serving import chat, tokens
from jaxrl_async.serving.client import EngineClient, EngineStopped
from jaxrl_async.serving.sampling import ModelNotFound, ServedModel

DISCONNECTED = 499  # the client went away first (nginx's code; nobody reads the reply)


def error(status: int, message: str, kind: str) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind, "param": None, "code": status}},
                        status_code=status)


def make_app(client: EngineClient, served: ServedModel) -> FastAPI:
    """The app serving `served` through `client` (which `serve` starts and stops)."""

    app = FastAPI(title="jaxrl_async serve")
    created = int(time.time())

    @app.get("/health")
    async def health() -> Response:
        if client.error is not None:
            return error(503, f"the engine died: {client.error}", "ServiceUnavailable")
        return JSONResponse({"status": "ok", **client.summary()})

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": served.name, "object": "model", "created": created,
                                            "owned_by": "jaxrl_async", "root": served.root,
                                            "max_model_len": served.limits.context}]}

    @app.post("/inference/v1/generate")
    async def generate(request: Request) -> Response:
        return await answer(request, lambda body: tokens.read_request(body, served),
                            lambda parsed, rid, samples: tokens.response(parsed, rid, samples))

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await answer(request, lambda body: chat.read_request(body, served),
                            lambda parsed, rid, samples: chat.response(parsed, rid, samples, served))

    async def answer(request: Request, read: Callable[[Any], Any], respond: Callable[..., dict]) -> Response:
        """Read the body, generate until done or until the client disconnects, respond."""
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            return error(400, f"body: not valid JSON ({e})", "BadRequestError")
        try:
            parsed = read(body)
            samples = await until_disconnected(
                request, client.generate(parsed.prompt_ids, parsed.sampling, priority=parsed.priority))
        except Disconnected:
            return Response(status_code=DISCONNECTED)
        except ModelNotFound as e:
            return error(404, str(e), "NotFoundError")
        except EngineStopped as e:
            return error(503, str(e), "ServiceUnavailable")
        except ValueError as e:  # ours (sampling.py, tokens.py, chat.py) or the engine's own check
            return error(400, str(e).splitlines()[0], "BadRequestError")
        return JSONResponse(respond(parsed, samples[0].request_id, samples))

    return app


async def serve(client: EngineClient, server: uvicorn.Server, sockets: list[socket.socket]) -> None:
    """Run `server` (over `make_app(client, ...)`) on `sockets` until it stops, the engine
    running on this loop meanwhile."""
    await client.start()
    try:
        await server.serve(sockets=sockets)
    finally:
        await client.stop()


class Disconnected(Exception):
    """The HTTP client went away before its reply."""


async def until_disconnected(request: Request, work: Awaitable[Any]) -> Any:
    """`work`'s result, or `Disconnected` (with `work` cancelled) when the client goes first.

    The body has been read, so the next ASGI message is the disconnect (or, once the reply is
    sent, nothing this waits for)."""
    task = asyncio.ensure_future(work)

    async def watch() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    watcher = asyncio.ensure_future(watch())
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:  # the handler itself is cancelled (the server stops): so is the work
        task.cancel()
        watcher.cancel()
        raise
    watcher.cancel()
    if not task.done():
        task.cancel()  # EngineClient.generate aborts the request in the engine
        await asyncio.gather(task, return_exceptions=True)
        raise Disconnected
    return task.result()
