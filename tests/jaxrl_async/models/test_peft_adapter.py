"""PEFT adapters: what we write, `peft` + transformers load onto the base with our logits; what
we read back is what we wrote; a directory that does not fit the model is one line naming
`model.adapter`."""

import json
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxrl_async.models.config import ModelConfig
from jaxrl_async.models.hf_weights import save_hf
from jaxrl_async.models.loading import load_model
from jaxrl_async.models.lora import LoraAdapter, init_adapter
from jaxrl_async.models.peft_adapter import load_peft, save_peft
from jaxrl_async.models.transformer import Transformer, layer_shapes

CFG = ModelConfig.tiny()
TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def trained_adapter(cfg: ModelConfig = CFG, rank: int = 4, targets=TARGETS, seed: int = 1) -> LoraAdapter:
    """As after training: B nonzero (a fresh adapter's B is 0 and would test nothing)."""
    params = init_adapter(layer_shapes(cfg), rank, targets, jax.random.key(seed))
    keys = iter(jax.random.split(jax.random.key(seed + 100), 32))
    params = jax.tree.map(lambda x: x + 0.1 * jax.random.normal(next(keys), x.shape), params)
    return LoraAdapter(params, 8.0 / rank)


def our_logits(model: Transformer, tokens: np.ndarray, adapter: LoraAdapter | None) -> np.ndarray:
    positions = np.broadcast_to(np.arange(tokens.shape[1]), tokens.shape)
    return np.asarray(model(jnp.asarray(tokens), jnp.asarray(positions), adapter=adapter))


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """A random tiny model's HF files in base/, its adapter in adapter/, both in both/ (a LoRA run's hf/)."""
    root = tmp_path_factory.mktemp("peft")
    model = Transformer(CFG, rngs=nnx.Rngs(0))
    adapter = trained_adapter()
    save_hf(model, CFG, root / "base")
    save_peft(adapter, CFG, root / "adapter", alpha=8.0, base_model=str(root / "base"))
    shutil.copytree(root / "base", root / "both")
    save_peft(adapter, CFG, root / "both", alpha=8.0, base_model="tiny")
    return root, model, adapter


def test_what_we_read_back_is_what_we_wrote(exported):
    root, _, adapter = exported
    back = load_peft(root / "adapter", CFG)
    assert back.scale == adapter.scale and back.rank == 4
    for (path, x), y in zip(jax.tree_util.tree_flatten_with_path(adapter.params)[0], jax.tree.leaves(back.params)):
        np.testing.assert_array_equal(np.asarray(x), y, err_msg=jax.tree_util.keystr(path))


def test_peft_loads_the_adapter_onto_the_base_with_our_logits(exported):
    torch = pytest.importorskip("torch", reason="torch is not installed (pip install -e '.[test]')")
    transformers = pytest.importorskip("transformers", reason="transformers is not installed (pip install -e '.[lora]')")
    peft = pytest.importorskip("peft", reason="peft is not installed (pip install -e '.[lora]')")
    root, model, adapter = exported
    tokens = np.random.default_rng(0).integers(0, CFG.vocab_size, (2, 12))
    want = our_logits(model, tokens, adapter)
    assert np.abs(want - our_logits(model, tokens, None)).max() > 1e-2  # the adapter matters
    base = transformers.AutoModelForCausalLM.from_pretrained(root / "base", dtype=torch.float32)
    ref = peft.PeftModel.from_pretrained(base, root / "adapter").eval()
    with torch.no_grad():
        got = ref(torch.from_numpy(tokens)).logits.numpy()
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=1e-4)
    # A LoRA run's hf/ (base and adapter side by side): transformers applies the adapter itself.
    embedded = transformers.AutoModelForCausalLM.from_pretrained(root / "both", dtype=torch.float32).eval()
    with torch.no_grad():
        np.testing.assert_allclose(embedded(torch.from_numpy(tokens)).logits.numpy(), want, atol=1e-4, rtol=1e-4)


def test_model_adapter_merges_the_adapter_into_the_loaded_model(exported):
    root, model, adapter = exported
    tokens = np.random.default_rng(1).integers(0, CFG.vocab_size, (1, 10))
    loaded = load_model(str(root / "both"), adapter=str(root / "both"))  # hf/'s adapter file is not a weight
    np.testing.assert_allclose(our_logits(loaded.model, tokens, None), our_logits(model, tokens, adapter),
                               atol=1e-4, rtol=1e-4)


def _edited(root, tmp_path, **config):
    target = tmp_path / "edited"
    shutil.copytree(root / "adapter", target)
    values = json.loads((target / "adapter_config.json").read_text())
    values.update(config)
    (target / "adapter_config.json").write_text(json.dumps(values))
    return target


def test_an_adapter_that_does_not_fit_is_one_line_naming_the_key(exported, tmp_path):
    root, _, _ = exported
    other = ModelConfig.tiny(hidden_size=32)
    with pytest.raises(ValueError, match=r"^model.adapter='.*': tensor \S+ is \[\d+, \d+\]; a rank-4 adapter of this "
                                         r"model's \w+ is \[\d+, \d+\] \(an adapter for another base model or rank\?\)"):
        load_peft(root / "adapter", other)
    with pytest.raises(ValueError, match=r"^model.adapter='.*': tensor \S+ is \[\d+, \d+\]; a rank-8 adapter"):
        load_peft(_edited(root, tmp_path, r=8), CFG)
    with pytest.raises(ValueError, match=r"^model.adapter='.*': target module 'c_attn' matches no module"):
        load_peft(_edited(root, tmp_path / "x", target_modules=["c_attn"]), CFG)
    with pytest.raises(ValueError, match=r"is for layer 1; the model has 1 layers"):
        load_peft(root / "adapter", ModelConfig.tiny(num_layers=1))
    with pytest.raises(ValueError, match=r"^model.adapter='.*': not a PEFT adapter directory"):
        load_peft(root / "base", CFG)
