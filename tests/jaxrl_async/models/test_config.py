"""ModelConfig: reading Hugging Face configs, and one-line errors for what it cannot run."""

import pytest

from jaxrl_async.models import ModelConfig


def test_from_hf_reads_llama_qwen2_and_qwen3_configs():
    base = {"vocab_size": 32, "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1,
            "num_attention_heads": 4, "num_key_value_heads": 2, "eos_token_id": [5, 6]}
    llama = ModelConfig.from_hf({**base, "model_type": "llama", "rope_theta": 5e5,
                                 "rope_scaling": {"type": "linear", "factor": 2.0}})
    assert (llama.head_dim, llama.rope_theta, llama.rope_type) == (4, 5e5, "linear")
    assert llama.eos_token_ids == (5, 6) and not llama.attention_bias
    qwen2 = ModelConfig.from_hf({**base, "architectures": ["Qwen2ForCausalLM"]})
    assert qwen2.attention_bias and not qwen2.qk_norm
    qwen3 = ModelConfig.from_hf({**base, "model_type": "qwen3", "head_dim": 8,
                                 "rope_parameters": {"rope_type": "default", "rope_theta": 1e6}})
    assert qwen3.qk_norm and qwen3.head_dim == 8 and qwen3.rope_scaling is None
    assert ModelConfig.from_hf(qwen3.to_hf()) == qwen3
    assert hash(llama) == hash(ModelConfig.from_hf(llama.to_hf()))


def test_bad_configs_are_one_line_value_errors_naming_the_field():
    base = {"vocab_size": 32, "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1,
            "num_attention_heads": 4}
    with pytest.raises(ValueError, match="unsupported architecture: model_type='gpt2'"):
        ModelConfig.from_hf({**base, "model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]})
    with pytest.raises(ValueError, match="num_kv_heads=3"):
        ModelConfig.tiny(num_kv_heads=3)
    with pytest.raises(ValueError, match="dtype='float16'"):
        ModelConfig.tiny(dtype="float16")
    with pytest.raises(ValueError, match="rope_type='longrope'"):
        ModelConfig.tiny(rope_scaling={"rope_type": "longrope"})
