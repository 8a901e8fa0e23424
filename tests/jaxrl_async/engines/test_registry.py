"""The engine registry: one name -> config, facts and builder table for job/ and the Ray workers."""

import pytest

from jaxrl_async.engines.jax.config import EngineConfig
from jaxrl_async.engines.jax.engine import JaxEngine
from jaxrl_async.engines.registry import ENGINES, EngineEntry, build_engine, engine_config, register_engine
from jaxrl_async.engines.vllm.config import VllmEngineConfig
from jaxrl_async.models.loading import load_model


def test_each_engine_group_is_typed_by_its_registered_config():
    assert engine_config("jax", {"num_slots": 4}) == EngineConfig(num_slots=4)
    assert engine_config("vllm", {}) == VllmEngineConfig()
    assert {name: entry.config for name, entry in ENGINES.items()} == {"jax": EngineConfig, "vllm": VllmEngineConfig}


def test_an_unknown_engine_or_key_is_one_line_naming_the_choices():
    with pytest.raises(ValueError, match=r"engine.name='tgi': must be one of \('jax', 'vllm'\)"):
        engine_config("tgi", {})
    with pytest.raises(ValueError, match=r"engine.slots: unknown key \(known: adapter_versions, cache_dtype,"):
        engine_config("jax", {"slots": 4})


def test_a_second_engine_under_a_registered_name_is_refused():
    with pytest.raises(ValueError, match="engine 'jax' registered twice"):
        register_engine("jax", EngineEntry(EngineConfig, ENGINES["jax"].facts, lambda config, loaded, mesh: None))


def test_the_jax_builder_makes_an_engine_and_vllm_refuses_a_mesh():
    loaded = load_model("tiny")
    engine = build_engine("jax", EngineConfig(num_slots=2, max_len=32), loaded)
    assert isinstance(engine, JaxEngine) and engine.core.config.num_slots == 2
    with pytest.raises(ValueError, match="vLLM places itself"):
        build_engine("vllm", VllmEngineConfig(), loaded, mesh=object())


def test_both_engines_speak_the_one_weight_sync_vocabulary():
    assert VllmEngineConfig().sync_mode == EngineConfig().sync_mode == "partial"
    assert engine_config("vllm", {"sync_mode": "resubmit"}).sync_mode == "resubmit"
    with pytest.raises(ValueError, match=r"^engine.sync_mode='keep' is now 'partial'$"):
        engine_config("vllm", {"sync_mode": "keep"})
    with pytest.raises(ValueError, match=r"^engine.sync_mode='resubmit': must be one of partial, drain$"):
        engine_config("jax", {"sync_mode": "resubmit"})


def test_an_unknown_transport_option_is_one_line_naming_the_option_and_the_known_ones():
    with pytest.raises(ValueError, match=r"engine.transport_options.dir: not an option of transport 'disk' "
                                         r"\(it takes \['directory', 'keep'\]\)"):
        engine_config("vllm", {"transport": "disk", "transport_options": {"dir": "/tmp/w"}})
    assert engine_config("vllm", {"transport": "disk", "transport_options": {"keep": 3}}).transport_options == {"keep": 3}
