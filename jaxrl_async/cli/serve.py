"""`python -m jaxrl_async.serve [overrides]`: serve a model over HTTP, token-in/token-out and chat.

    python -m jaxrl_async.serve model=smollm2_135m port=8000 engine.max_len=2048
    python -m jaxrl_async.serve model.source=RUN_DIR/hf engine=vllm

Hydra composes `conf/serve.yaml` (groups: model, engine; the top-level keys are `ServeConfig`'s).
The engine is the one training uses, built from the engine registry: `engine=jax` (default) or
`engine=vllm`, with the same `engine.*` keys. Routes (jaxrl_async/serving/app.py):
`POST /inference/v1/generate` (vLLM's token-in/token-out schema, what verifiers' TrainClient
calls; each choice also carries `token_versions`), `POST /v1/chat/completions` (OpenAI,
non-streaming), `GET /v1/models`, `GET /health`. It listens on `host` (127.0.0.1: this machine
only) until Ctrl-C or SIGTERM, then prints what it served as one JSON object on stdout.

Bad input — an unknown model or key, a bad value, a port it cannot listen on, FastAPI or uvicorn
missing — is one `error:` line on stderr and exit status 1 (cli/common.py), before the model
loads where it can be.
"""

from __future__ import annotations

import importlib.util
import json
import signal
import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from jaxrl_async.cli.common import note, run_cached, run_command
from jaxrl_async.engines.registry import AnyEngineConfig, EngineFacts, engine_config, entry_of
from jaxrl_async.models.config import ModelSpec
from planner.configs import build, check

# The engine, the model, FastAPI and uvicorn are imported where the work starts, so that `--help`
# (which reads ServeConfig) stays free of them.
SUMMARY = __doc__.splitlines()[0].split(": ", 1)[1]  # the first line of --help
INSTALL = 'pip install -e ".[serve]"'


@dataclass(frozen=True)
class ServeConfig:
    """`python -m jaxrl_async.serve`'s top-level keys, with their defaults (`--help` lists them).

    Attributes:
      model: the `model=` group: a registered name, a HF directory or a .gguf file
      engine: the `engine=` group: jax | vllm, with the same keys as in training
      host: the address to listen on; 127.0.0.1 answers this machine only, 0.0.0.0 every interface
      port: the TCP port; 0 takes a free one (the start-up line names it)
      served_model_name: the model id clients send as `model`; null: model.source
    """

    model: ModelSpec
    engine: AnyEngineConfig
    host: str = "127.0.0.1"
    port: int = 8000
    served_model_name: str | None = None

    def __post_init__(self) -> None:
        check(isinstance(self.port, int) and 0 <= self.port < 65536, "port", self.port, "must be an int in [0, 65536)")


def typed_config(cfg: dict[str, Any]) -> ServeConfig:
    """The composed `conf/serve.yaml` -> `ServeConfig`; every problem is a one-line ValueError."""
    model, engine = cfg.get("model"), cfg.get("engine")
    check(isinstance(model, dict) and "source" in model, "model", model, "choose one with model=NAME (conf/model/*.yaml)")
    check(isinstance(engine, dict), "engine", engine, "choose one with engine=NAME (conf/engine/*.yaml)")
    values = dict(engine)
    typed_engine = engine_config(values.pop("name", "jax"), values)
    return build(ServeConfig, {**cfg, "model": {**model, "source": str(model["source"])}, "engine": typed_engine}, "")


def require(module: str, what: str) -> None:
    """An optional package the command needs: missing, it is one line naming the install."""
    if importlib.util.find_spec(module) is None:
        raise ValueError(f"{what}: the {module!r} package is not installed ({INSTALL})")


def listen(host: str, port: int) -> socket.socket:
    """The server's socket, bound before the model loads: a port in use fails at once."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise ValueError(f"port={port}: cannot listen on {host}:{port} ({e.strerror or e}); "
                         "choose another port (port=0: any free one)") from None
    sock.set_inheritable(True)
    return sock


def inert_keys(facts: EngineFacts) -> list[str]:
    """One line per `engine.` key that cannot act in the server (`EngineFacts`: the registry's)."""
    lines = [f"engine.{key}={value} has no effect here: the server runs one engine on the model's device"
             for key, value in (("replicas", facts.replicas), ("tensor_parallel", facts.tensor_parallel))
             if value != 1 and not facts.places_itself]
    if facts.speculation is not None and facts.speculation.when == "critical":
        lines.append("engine.speculation.when=critical has no effect here: the server marks no request critical "
                     "(engine.speculation.when=always speculates every request)")
    return lines


def serve(config: ServeConfig, *, say: Callable[[str], None] = lambda _: None) -> dict[str, int]:
    """Serve until SIGINT or SIGTERM; returns the client's counts (requests finished, aborted ...)."""
    require("fastapi", "serve")
    require("uvicorn", "serve")
    entry = entry_of(config.engine)
    if entry.package is not None:
        require(entry.package, f"engine={config.engine.name}")
    sock = listen(config.host, config.port)
    try:
        return _serve(config, sock, say)
    finally:
        sock.close()


def _serve(config: ServeConfig, sock: socket.socket, say: Callable[[str], None]) -> dict[str, int]:
    import asyncio

    import uvicorn

    from jaxrl_async.engines.registry import build_engine
    from jaxrl_async.models.loading import load_model
    from jaxrl_async.serving import app
    from jaxrl_async.serving.client import EngineClient
    from jaxrl_async.serving.sampling import ServedModel

    facts = entry_of(config.engine).facts(config.engine)
    for line in inert_keys(facts):
        say(f"warning: {line}")
    say(f"loading model {config.model.source} ...")
    loaded = load_model(config.model.source, dtype=config.model.dtype)
    if loaded.tokenizer is None:
        raise ValueError(f"model.source={config.model.source!r}: has no tokenizer.json; cannot serve chat")
    engine = build_engine(config.engine.name, config.engine, loaded)
    check(engine.limits is not None, "engine", config.engine.name, "states no request limits; cannot serve it")
    name = config.served_model_name or config.model.source
    served = ServedModel(name, config.model.source, loaded.tokenizer, loaded.stop_token_ids, engine.limits)
    client = EngineClient(engine)
    server = uvicorn.Server(uvicorn.Config(app.make_app(client, served), log_level="warning", access_log=False))
    # uvicorn stops on SIGINT/SIGTERM and then raises the signal again for the handler it found:
    # these handlers take it, so a stop is the summary line and status 0, not a traceback.
    previous = {sig: signal.signal(sig, lambda *_: None) for sig in (signal.SIGINT, signal.SIGTERM)}
    host, port = sock.getsockname()[:2]
    say(f"serving {name!r} on http://{host}:{port} (POST /inference/v1/generate, /v1/chat/completions; "
        "Ctrl-C stops)")
    try:
        asyncio.run(app.serve(client, server, [sock]))
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if not server.started:
        raise ValueError(f"engine={config.engine.name}: the server did not start (the engine's error is above)")
    return client.summary()


def main(argv: list[str] | None = None) -> int:
    return run_command("serve", SUMMARY, ServeConfig, argv, typed_config, lambda config: serve(config, say=note),
                       lambda config, counts: json.dumps(counts) + "\n")


def run() -> None:
    """`python -m` entry (this module's and the jaxrl_async/serve.py shim's)."""
    run_cached(main)


if __name__ == "__main__":
    run()
