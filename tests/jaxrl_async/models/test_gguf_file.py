"""GGUF loading: dequantization, llama.cpp's q/k row permutation, tokenizer from metadata, errors.

The files are written here with the `gguf` package's own writer and quantizer, the way llama.cpp's
converter writes them (q/k rows permuted for Llama).
"""

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

from jaxrl_async.models import ModelConfig
from jaxrl_async.models.hf_weights import to_hf_state_dict
from jaxrl_async.models.loading import build_model, load_model
from jaxrl_async.tokenizer import tiny_tokenizer
from tests.helpers.gguf_files import write_metadata_gguf

_HF_TO_GGUF = {
    "input_layernorm.weight": "attn_norm.weight", "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight", "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight", "post_attention_layernorm.weight":
    "ffn_norm.weight", "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight", "mlp.down_proj.weight": "ffn_down.weight",
}
# One quantization per kind of tensor, so every supported type is exercised.
_QUANT = {"attn_q.weight": Q.Q8_0, "attn_k.weight": Q.Q4_0, "attn_v.weight": Q.Q4_1,
          "attn_output.weight": Q.BF16, "ffn_gate.weight": Q.F16, "ffn_up.weight": Q.Q8_0,
          "ffn_down.weight": Q.Q4_1, "token_embd.weight": Q.Q8_0, "output.weight": Q.F16}


def _permute(w, heads):
    """llama.cpp convert_hf_to_gguf's `permute` of q/k rows."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _write_gguf(path, cfg, tensors, *, override_type=None):
    """Write `tensors` (HF names) as a llama GGUF; returns the HF tensors as dequantized."""
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(cfg.num_layers)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_heads)
    w.add_head_count_kv(cfg.num_kv_heads)
    w.add_rope_freq_base(cfg.rope_theta)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_vocab_size(cfg.vocab_size)
    tok = tiny_tokenizer()
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list([tok.id_to_token(i) for i in range(tok.vocab_size)])
    w.add_token_types([1] * 256 + [3] * (tok.vocab_size - 256))
    w.add_token_merges([])
    w.add_bos_token_id(tok.bos_token_id)
    w.add_eos_token_id(tok.eos_token_ids[1])
    w.add_chat_template(tok.chat_template)
    expected = {}
    for name, value in tensors.items():
        value = np.asarray(value, np.float32)
        if name.startswith("model.layers."):
            _, _, i, rest = name.split(".", 3)
            gname = f"blk.{i}.{_HF_TO_GGUF[rest]}"
            short = _HF_TO_GGUF[rest]
        else:
            gname = {"model.embed_tokens.weight": "token_embd.weight",
                     "model.norm.weight": "output_norm.weight", "lm_head.weight": "output.weight"}[name]
            short = gname
        qtype = (override_type or {}).get(gname, _QUANT.get(short, Q.F32))
        stored = value
        if short == "attn_q.weight":
            stored = _permute(value, cfg.num_heads)
        elif short == "attn_k.weight":
            stored = _permute(value, cfg.num_kv_heads)
        if qtype == Q.I32:
            w.add_tensor(gname, stored.astype(np.int32))
            continue
        data = gguf.quants.quantize(stored, qtype)
        w.add_tensor(gname, data, raw_shape=data.shape if qtype in (Q.F32, Q.F16) else None,
                     raw_dtype=qtype)
        expected[name] = gguf.quants.dequantize(gguf.quants.quantize(value, qtype), qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return expected


@pytest.fixture(scope="module")
def source():
    cfg = ModelConfig.tiny(hidden_size=64, intermediate_size=128, rope_theta=50000.0)
    return cfg, to_hf_state_dict(build_model(cfg, seed=5), cfg)


def test_gguf_loads_dequantized_unpermuted_weights_and_its_tokenizer(source, tmp_path):
    cfg, tensors = source
    expected = _write_gguf(tmp_path / "m.gguf", cfg, tensors)
    loaded = load_model(str(tmp_path / "m.gguf"))
    # GGUF keeps eps as float32; eos comes from the file (<|im_end|> here)
    assert loaded.cfg.rms_norm_eps == pytest.approx(cfg.rms_norm_eps)
    assert loaded.cfg.replace(eos_token_ids=cfg.eos_token_ids, rms_norm_eps=cfg.rms_norm_eps) == cfg
    got = to_hf_state_dict(loaded.model, loaded.cfg)
    assert sorted(got) == sorted(expected)
    for name, want in expected.items():
        np.testing.assert_allclose(got[name], want, rtol=0, atol=0, err_msg=name)
    # quantization error is small, so the permutation was undone (not just the shape)
    q = "model.layers.0.self_attn.k_proj.weight"
    assert np.abs(got[q] - tensors[q]).max() < 0.25 * np.abs(tensors[q]).max()
    text = "héllo <|im_end|>"
    assert loaded.tokenizer.encode(text) == tiny_tokenizer().encode(text)
    assert loaded.cfg.eos_token_ids == (tiny_tokenizer().eos_token_ids[1],)
    assert loaded.chat_template == tiny_tokenizer().chat_template


def test_unsupported_gguf_quantization_and_architecture_are_named(source, tmp_path):
    cfg, tensors = source
    _write_gguf(tmp_path / "i32.gguf", cfg, tensors,
                override_type={"blk.1.ffn_norm.weight": Q.I32})
    with pytest.raises(ValueError, match="GGUF tensor blk.1.ffn_norm.weight: quantization I32 is "
                                         "not supported"):
        load_model(str(tmp_path / "i32.gguf"))
    w = gguf.GGUFWriter(str(tmp_path / "gpt2.gguf"), "gpt2")
    w.add_tensor("token_embd.weight", np.zeros((4, 32), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ValueError, match="unsupported GGUF architecture general.architecture='gpt2'"):
        load_model(str(tmp_path / "gpt2.gguf"))


@pytest.fixture(scope="module")
def gguf_file(source, tmp_path_factory):
    cfg, tensors = source
    path = tmp_path_factory.mktemp("gguf") / "m.gguf"
    _write_gguf(path, cfg, tensors)
    return path


def _cut(path, tmp_path, size):
    out = tmp_path / "cut.gguf"
    out.write_bytes(path.read_bytes()[:size])
    return out


@pytest.mark.parametrize("which", [0, 5, -1])
def test_a_gguf_cut_inside_a_tensor_names_the_file_and_that_tensor(gguf_file, tmp_path, which):
    by_offset = sorted(gguf.GGUFReader(str(gguf_file)).tensors, key=lambda t: t.data_offset)
    t = by_offset[which]
    cut = _cut(gguf_file, tmp_path, int(t.data_offset + t.n_bytes) - 1)  # one byte short of its end
    later = len(by_offset) - 1 - (which % len(by_offset))
    with pytest.raises(ValueError) as e:
        load_model(str(cut))
    msg = str(e.value)
    assert msg.startswith(f"{cut}: truncated GGUF file: tensor {t.name} runs past the end") and "\n" not in msg
    assert (f"; {later} tensors after it are cut too" in msg) == (later > 0), msg


def test_a_gguf_cut_one_byte_after_its_last_tensor_is_whole_and_loads(gguf_file, tmp_path):
    last = max(gguf.GGUFReader(str(gguf_file)).tensors, key=lambda t: t.data_offset)
    assert load_model(str(_cut(gguf_file, tmp_path, int(last.data_offset + last.n_bytes)))).model is not None


@pytest.mark.parametrize("size", [3, 30, 200])
def test_a_gguf_cut_inside_its_metadata_is_one_line_naming_the_file(gguf_file, tmp_path, size):
    cut = _cut(gguf_file, tmp_path, size)
    with pytest.raises(ValueError) as e:
        load_model(str(cut))
    msg = str(e.value)
    assert msg.startswith(f"{cut}: truncated GGUF file: its metadata runs past the end") and "\n" not in msg, msg


@pytest.mark.parametrize(("data", "reason"), [(b"", "cannot mmap an empty file"), (b"GGML" + bytes(60), "magic")])
def test_an_empty_file_or_another_format_is_not_a_readable_gguf(tmp_path, data, reason):
    path = tmp_path / "x.gguf"
    path.write_bytes(data)
    with pytest.raises(ValueError, match=rf"^{path}: not a readable GGUF file \(.*{reason}"):
        load_model(str(path))


@pytest.mark.parametrize("key", ["llama.block_count", "llama.embedding_length", "llama.feed_forward_length",
                                 "llama.attention.head_count", "tokenizer.ggml.tokens"])
def test_a_gguf_without_a_required_key_is_one_line_naming_the_file_and_the_key(tmp_path, key):
    whole = write_metadata_gguf(tmp_path / "whole.gguf")
    # Non-trivial: the same file with every key passes the metadata checks (it fails later, on
    # its missing tensors, which this file does not have).
    with pytest.raises(ValueError) as whole_error:
        load_model(str(whole))
    assert "GGUF metadata" not in str(whole_error.value)
    path = write_metadata_gguf(tmp_path / "m.gguf", without={key})
    with pytest.raises(ValueError) as e:
        load_model(str(path))
    assert str(e.value) == f"model.source={path}: no {key} in the GGUF metadata"
