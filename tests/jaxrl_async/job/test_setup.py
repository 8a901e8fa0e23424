"""`TrainSetup`: typed once, and what the run needs of a backend or a cluster mode is what their
registries state — a third backend registered here runs a whole job without a change to job/."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import re
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import pytest
from omegaconf import OmegaConf

from jaxrl_async.cluster.config import ClusterConfig
from jaxrl_async.cluster.ray.config import RayClusterConfig
from jaxrl_async.engines.jax.config import EngineConfig
from jaxrl_async.engines.registry import ENGINES, EngineEntry, EngineFacts, register_engine
from jaxrl_async.engines.vllm.config import VllmEngineConfig
from jaxrl_async.job.build import plan_run_placement
from jaxrl_async.job.lifecycle import TrainJob
from jaxrl_async.job.report import placement_summary, trace_meta
from jaxrl_async.job.setup import TrainSetup, typed_config
from tests.helpers import REPO
from tests.helpers.train_runs import QUIET, compose_train, read_jsonl

SMALL = ["steps=2", "batch_groups=2", "group_size=4", "max_new_tokens=4"]


def setup_with(engine: dict[str, Any], overrides: list[str] = ()) -> TrainSetup:
    """The composed default config with the `engine=` group replaced by `engine`."""
    plain = OmegaConf.to_container(compose_train([*QUIET, *SMALL, *overrides]), resolve=True)
    return typed_config({**plain, "engine": engine})


def test_the_setup_has_no_untyped_field():
    hints = typing.get_type_hints(TrainSetup)
    assert [name for name, hint in hints.items() if hint is Any] == []
    assert set(typing.get_args(hints["engine"])) == {EngineConfig, VllmEngineConfig}


def test_the_jax_engine_states_its_slots_kv_replicas_sync_mode_and_placement():
    config = EngineConfig(num_slots=16, max_len=48, replicas=2, tensor_parallel=1, sync_mode="drain", colocate=False)
    assert ENGINES["jax"].facts(config) == EngineFacts(
        slots_key="num_slots", slots=16, kv_tokens=16 * 48, replicas=2, tensor_parallel=1, sync_mode="drain",
        colocate=False, places_itself=False, speculation=config.speculation)
    assert config.name == "jax"


def test_the_vllm_engine_places_itself_and_sizes_its_own_cache():
    config = VllmEngineConfig(max_num_seqs=24, tensor_parallel_size=2, sync_mode="resubmit")
    assert ENGINES["vllm"].facts(config) == EngineFacts(
        slots_key="max_num_seqs", slots=24, kv_tokens=None, replicas=1, tensor_parallel=2, sync_mode="resubmit",
        colocate=False, places_itself=True, speculation=config.speculation, pins_adapters=True)


def test_pinned_is_one_rule_over_backends_lora_and_an_engine_that_pins_adapters():
    """A run trains LoRA on an engine that pins adapters: sync mode "pinned"; either missing: its own."""
    jax_k3, jax_k1 = EngineConfig(adapter_versions=3), EngineConfig()
    vllm = VllmEngineConfig(sync_mode="resubmit", adapter_rank=8, adapter_versions=2)
    cases = [(jax_k3, True, "pinned"), (jax_k3, False, "partial"), (jax_k1, True, "partial"),
             (vllm, True, "pinned"), (vllm, False, "resubmit")]
    for config, lora, mode in cases:
        assert ENGINES[config.name].facts(config).with_lora(lora).sync_mode == mode, (config.name, lora)
    assert ENGINES["vllm"].facts(vllm).adapter_versions == 2


def test_the_default_run_reads_its_trace_and_placement_facts_from_the_jax_entry():
    setup = typed_config(compose_train([]))
    placement = plan_run_placement(setup)
    meta = trace_meta(setup, placement)
    assert {k: meta[k] for k in ("engine", "workers", "slots", "kv_tokens", "sync_mode", "colocated")} == {
        "engine": "jax", "workers": 1, "slots": 64, "kv_tokens": 64 * 128, "sync_mode": "partial", "colocated": True}
    assert "speculation" not in meta  # engine.speculation.when=never: nothing to calibrate
    assert placement_summary(setup, placement)["engine"] == {
        "devices": 1, "replicas": 1, "tensor_parallel": 1, "colocate": True, "backend": "jax"}


def test_a_cluster_that_runs_the_engine_workers_states_their_count_and_places_nothing_of_the_engine():
    setup = typed_config(compose_train(["engine.replicas=1"]))
    ray = dataclasses.replace(setup, cluster=ClusterConfig("ray", RayClusterConfig(num_workers=3)))
    assert (setup.engine_workers, setup.engine_in_process) == (1, True)
    assert (ray.engine_workers, ray.engine_in_process) == (3, False)
    placement = plan_run_placement(ray)
    meta = trace_meta(ray, placement)
    assert (meta["workers"], meta["slots"], meta["colocated"]) == (3, 64, False)
    assert placement_summary(ray, placement)["engine"] == {"backend": "ray/jax", "replicas": 3}


@pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="ray is not installed (pip install -e '.[ray]')")
def test_migration_is_refused_at_start_up_where_the_cluster_cannot_move_a_request():
    with pytest.raises(ValueError) as info:
        typed_config(compose_train(["cluster=ray", "policy.migrate=true"]))
    assert str(info.value).startswith("policy.migrate=true: cluster=ray cannot move a running request between "
                                      "its engine workers; set policy.migrate=false"), info.value
    assert "\n" not in str(info.value)
    assert typed_config(compose_train(["cluster=ray", "policy.migrate=false"])).cluster.name == "ray"
    assert typed_config(compose_train(["policy.migrate=true"])).cluster.name == "local"  # in-process replicas move


def test_a_backend_that_places_itself_is_summarized_by_its_own_facts():
    setup = typed_config(compose_train([]))
    vllm = dataclasses.replace(setup, engine=VllmEngineConfig(max_num_seqs=16, tensor_parallel_size=2))
    placement = plan_run_placement(vllm)
    assert placement_summary(vllm, placement)["engine"] == {"backend": "vllm", "replicas": 1, "tensor_parallel": 2}
    meta = trace_meta(vllm, placement)
    assert (meta["engine"], meta["slots"], meta["kv_tokens"], meta["colocated"]) == ("vllm", 16, None, False)


# -------------------------------------------------------------------- a third backend, from here
@dataclass(frozen=True)
class LanesConfig:
    """A made-up backend: `engine.lanes` sequences at once, drained on every weight update."""

    name: ClassVar[str] = "lanes"
    lanes: int = 8
    max_len: int = 64


BUILT: list[tuple[LanesConfig, Any]] = []


def _lanes_facts(config: LanesConfig) -> EngineFacts:
    return EngineFacts("lanes", config.lanes, config.lanes * config.max_len, replicas=1, tensor_parallel=1,
                       sync_mode="drain", colocate=True, places_itself=False)


def _lanes_build(config: LanesConfig, loaded, mesh):
    from jaxrl_async.engines.jax.engine import JaxEngine

    BUILT.append((config, mesh))
    return JaxEngine(loaded.model, loaded.cfg, EngineConfig(num_slots=config.lanes, max_len=config.max_len,
                                                            sync_mode="drain"), mesh=mesh)


@pytest.fixture
def lanes_backend():
    register_engine("lanes", EngineEntry(LanesConfig, _lanes_facts, _lanes_build))
    BUILT.clear()
    yield
    del ENGINES["lanes"]


def test_a_registered_third_backend_is_typed_checked_and_run_by_the_job_unchanged(lanes_backend, tmp_path):
    with pytest.raises(ValueError, match=r"^engine\.lanes=2: must be >= group_size=4 "):
        setup_with({"name": "lanes", "lanes": 2})
    with pytest.raises(ValueError, match=r"engine\.num_slots: unknown key"):
        setup_with({"name": "lanes", "num_slots": 8})
    setup = setup_with({"name": "lanes", "lanes": 8})
    assert setup.engine == LanesConfig(lanes=8) and setup.engine_name == "lanes"
    out = TrainJob(setup, tmp_path).run()
    assert out["completed"] and out["audit_ok"] and out["steps"] == 2
    assert BUILT == [(LanesConfig(lanes=8), None)]  # built once, on the default device
    assert out["placement"]["engine"]["backend"] == "lanes"
    run_line = read_jsonl(tmp_path / "trace.jsonl")[0]
    assert {k: run_line[k] for k in ("engine", "workers", "slots", "kv_tokens", "sync_mode", "colocated")} == {
        "engine": "lanes", "workers": 1, "slots": 8, "kv_tokens": 8 * 64, "sync_mode": "drain", "colocated": True}
    assert json.loads((tmp_path / "summary.json").read_text())["audit_ok"]


def test_a_config_whose_name_is_not_the_registered_one_is_refused():
    with pytest.raises(ValueError, match="LanesConfig.name must be the registered name 'other'"):
        register_engine("other", EngineEntry(LanesConfig, _lanes_facts, _lanes_build))
    assert "other" not in ENGINES


# Asking a config for a field by name, or branching on a backend's or a mode's name, is what
# the registries are for; the run's code does neither.
PROBES = re.compile(r"getattr\((setup\.)?engine\b|engine_name\s*[!=]=|cluster\.name\s*[!=]=|"
                    r"[!=]=\s*\"(jax|vllm|ray|local|slurm)\"")


@pytest.mark.parametrize("path", sorted((REPO / "jaxrl_async" / "job").glob("*.py"))
                         + sorted((REPO / "jaxrl_async" / "cli").glob("*.py")), ids=lambda p: p.name)
def test_the_run_code_neither_probes_an_engine_config_nor_branches_on_a_name(path: Path):
    assert [line for line in path.read_text().splitlines() if PROBES.search(line)] == []


def test_a_speculating_engines_run_line_carries_its_speculation_section():
    setup = typed_config(compose_train(["engine.speculation.when=critical", "engine.speculation.tokens=5"]))
    meta = trace_meta(setup, plan_run_placement(setup))
    assert meta["speculation"] == {"when": "critical", "method": "ngram", "tokens": 5, "draft_model": None,
                                   "ngram": 2, "max_active": 8}



def test_lora_with_cluster_ray_or_an_engine_that_cannot_take_adapters_is_refused_in_one_line(monkeypatch):
    lora = [*QUIET, *SMALL, "trainer.lora.rank=4"]
    # As if ray and vllm were installed (CI's main stage has neither): the refusal is LoRA's, not
    # the missing package's.
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: object() if name in ("vllm", "ray") else find_spec(name, *a))
    with pytest.raises(ValueError) as info:
        typed_config(compose_train([*lora, "cluster=ray"]))
    assert str(info.value).startswith("trainer.lora.rank=4: LoRA with cluster=ray is not built yet"), info.value
    # A backend that places itself and has no `serve_adapters` (vLLM's entry without it).
    monkeypatch.setitem(ENGINES, "vllm", dataclasses.replace(ENGINES["vllm"], serve_adapters=None))
    with pytest.raises(ValueError) as info:
        setup_with({"name": "vllm"}, ["trainer.lora.rank=4"])
    assert str(info.value) == ("trainer.lora.rank=4: engine=vllm cannot serve LoRA adapters; set trainer.lora.rank=0 "
                               "or use engine=jax or engine=vllm"), info.value


def test_lora_on_vllm_serves_the_adapters_pinned_sized_for_the_versions_in_flight(monkeypatch):
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: object() if name == "vllm" else find_spec(name, *a))
    setup = setup_with({"name": "vllm", "max_num_seqs": 8}, ["trainer.lora.rank=4", "max_staleness=2"])
    assert (setup.engine.adapter_rank, setup.engine.adapter_versions) == (4, 3)  # η + 1 versions in flight
    assert setup.engine_facts.sync_mode == "pinned"
    # Never more versions than sequences decoded at once; unbounded staleness: one per sequence.
    assert setup_with({"name": "vllm", "max_num_seqs": 8}, ["trainer.lora.rank=4", "max_staleness=20"]
                      ).engine.adapter_versions == 8
    assert setup_with({"name": "vllm", "max_num_seqs": 8}, ["trainer.lora.rank=4", "max_staleness=null"]
                      ).engine.adapter_versions == 8
    # engine.adapter_versions, when given, is kept; without LoRA nothing changes.
    assert setup_with({"name": "vllm", "max_num_seqs": 8, "adapter_versions": 5},
                      ["trainer.lora.rank=4"]).engine.adapter_versions == 5
    plain = setup_with({"name": "vllm", "max_num_seqs": 8, "sync_mode": "drain"})
    assert (plain.engine.adapter_rank, plain.engine_facts.sync_mode) == (0, "drain")
    # engine.adapter_rank is the run's to set: by hand it is refused unless it says the same.
    with pytest.raises(ValueError, match=r"^engine.adapter_rank=8: is set by the run from trainer.lora.rank \(here 0\)"):
        setup_with({"name": "vllm", "max_num_seqs": 8, "adapter_rank": 8})
    assert setup_with({"name": "vllm", "max_num_seqs": 8, "adapter_rank": 4},
                      ["trainer.lora.rank=4"]).engine.adapter_rank == 4
    with pytest.raises(ValueError, match=r"^trainer.lora.rank=600: engine=vllm serves LoRA ranks 1..512"):
        setup_with({"name": "vllm", "max_num_seqs": 8}, ["trainer.lora.rank=600"])
