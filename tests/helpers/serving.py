"""A real server (jaxrl_async/serving/app.py under uvicorn) on a free loopback port, in a thread,
over a tiny JAX engine; and the same requests run on an engine directly, to compare with."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from jaxrl_async.engines.base import GenerationEngine, GenerationRequest, SampleOutput, SamplingParams
from jaxrl_async.engines.jax.config import EngineConfig
from jaxrl_async.engines.jax.engine import JaxEngine
from jaxrl_async.models.loading import LoadedModel, load_model
from jaxrl_async.serving.client import EngineClient
from jaxrl_async.serving.sampling import ServedModel
from tests.helpers.engines import WrappedEngine, collect

ENGINE = EngineConfig(num_slots=4, max_len=64, min_bucket=16, decode_steps_per_call=2)


def tiny() -> LoadedModel:
    return load_model("tiny")


def served_model(loaded: LoadedModel, engine: GenerationEngine, name: str = "tiny") -> ServedModel:
    return ServedModel(name, "tiny", loaded.tokenizer, loaded.stop_token_ids, engine.limits)


class HoldingEngine(WrappedEngine):
    """A real engine whose requests never finish on their own (every piece is held back) and
    that records the aborts it is asked for: a caller that goes away is the only way out."""

    def __init__(self, inner: GenerationEngine) -> None:
        super().__init__(inner)
        self.aborted: list[str] = []

    @property
    def limits(self):
        return self.inner.limits

    async def abort(self, request_id: str) -> None:
        self.aborted.append(request_id)
        await self.inner.abort(request_id)

    def keep(self, out: SampleOutput) -> bool:
        return False


class DyingEngine(HoldingEngine):
    """A real engine whose output stream raises "device lost" at its first piece (a worker thread
    that died)."""

    async def outputs(self):
        async for _ in self.inner.outputs():
            raise RuntimeError("device lost")
        yield  # an async generator


@dataclass
class Running:
    url: str
    client: EngineClient
    served: ServedModel


@contextmanager
def running_server(loaded: LoadedModel, engine: GenerationEngine | None = None) -> Iterator[Running]:
    """Serve `engine` (default: a fresh tiny JAX engine) on 127.0.0.1:<free port> until the block ends."""
    import uvicorn

    from jaxrl_async.serving.app import make_app, serve

    engine = engine or JaxEngine(loaded.model, loaded.cfg, ENGINE)
    client = EngineClient(engine)
    served = served_model(loaded, engine)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(make_app(client, served), log_level="warning"))
    thread = threading.Thread(target=lambda: asyncio.run(serve(client, server, [sock])), daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the server did not start"
        time.sleep(0.01)
    try:
        yield Running(f"http://127.0.0.1:{sock.getsockname()[1]}", client, served)
    finally:
        server.should_exit = True
        thread.join(timeout=60)
        sock.close()
        assert not thread.is_alive(), "the server did not stop"


def run_directly(loaded: LoadedModel, prompt_ids: list[int], sampling: SamplingParams) -> list[SampleOutput]:
    """The request's samples from a fresh engine of the same config, without the server."""
    async def go() -> list[SampleOutput]:
        engine = JaxEngine(loaded.model, loaded.cfg, ENGINE)
        await engine.start()
        await engine.submit(GenerationRequest("direct", prompt_ids, sampling))
        got = await collect(engine, sampling.n)
        await engine.stop()
        return [got["direct", i] for i in range(sampling.n)]

    return asyncio.run(go())
