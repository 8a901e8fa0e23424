"""Read a llama.cpp GGUF file as a HF config dict, HF-named float32 tensors and metadata fields.

GGUF is turned into the HF layout so that one checked loader (`hf_weights.load_hf_state_dict`)
serves both formats. Tensors are dequantized with the `gguf` package's own `dequantize`; what it
cannot dequantize is a ValueError naming the tensor and its type. llama.cpp's converter permutes
the rows of Llama's q/k projections (interleaved RoPE); `_unpermute` undoes it. To support another
architecture, add it to `_ARCHS` and its tensor names to `_TENSOR_NAMES`.

A truncated file (an interrupted download) is a one-line ValueError naming the file and what is
cut: the metadata, or the first tensor whose data runs past the end (`_CheckedReader`); the
`gguf` reader alone fails inside numpy (an IndexError or a reshape error naming no tensor).
A file without a key the model or its tokenizer cannot do without (`REQUIRED_KEYS`, the
vocabulary `tokenizer.ggml.tokens`) is a `GGUFMissingKey` naming the file and the key, before any
tensor is read: without the check a missing vocabulary is a KeyError inside the tokenizer and a
missing `block_count` a `ModelConfig.num_layers=None` that names neither.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gguf
import numpy as np

# GGUF architecture -> HF model_type. Qwen2/3 files keep HF's row order; Llama files do not.
_ARCHS = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3"}
_PERMUTED_QK = {"llama"}
_TENSOR_NAMES = {  # GGUF name inside blk.{i}. -> HF name inside model.layers.{i}.
    "attn_norm.weight": "input_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_q_norm.weight": "self_attn.q_norm.weight",
    "attn_k_norm.weight": "self_attn.k_norm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
_TOP_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
# `{arch}.<key>` that every architecture's file must carry (the rest have defaults).
REQUIRED_KEYS = ("block_count", "embedding_length", "feed_forward_length", "attention.head_count")
TOKENS_KEY = "tokenizer.ggml.tokens"


class GGUFMissingKey(ValueError):
    """A GGUF file whose metadata lacks `key`: `<path>: no <key> in the GGUF metadata`."""

    def __init__(self, path: str | Path, key: str) -> None:
        super().__init__(f"{path}: no {key} in the GGUF metadata")
        self.path, self.key = str(path), key


class _CheckedReader(gguf.GGUFReader):
    """`gguf.GGUFReader` that checks each read against the file's size before numpy sees it.

    It hooks the reader's two internal steps that touch the file's bytes: `_get` (every header
    read) and `_build_tensors` (the tensor data views, laid out from the parsed tensor infos).
    """

    def __init__(self, path: str | Path) -> None:
        self._path = Path(path)
        try:
            super().__init__(str(path))
        except GGUFTruncated:
            raise
        except ValueError as e:  # the reader's own checks (magic, version, alignment) name no file
            raise ValueError(f"{path}: not a readable GGUF file ({e})") from None

    def _get(self, offset: int, dtype: Any, count: int = 1, override_order: Any = None) -> Any:
        end = int(offset) + np.dtype(dtype).itemsize * int(count)
        if end > len(self.data):
            raise GGUFTruncated(f"{self._path}: truncated GGUF file: its metadata runs past the end "
                                f"(needs byte {end}, the file has {len(self.data)})")
        return super()._get(offset, dtype, count, override_order)

    def _build_tensors(self, start_offs: int, fields: list) -> None:
        size = len(self.data)
        cut = []  # (data offset, end, name) of every tensor whose data runs past the end
        for field in fields:
            _, name, _, dims, raw_dtype, offset = field.parts
            block, type_size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(int(raw_dtype[0]))]
            begin = int(start_offs) + int(offset[0])
            end = begin + int(np.prod(dims, dtype=np.int64)) * type_size // block
            if end > size:
                cut.append((begin, end, bytes(name).decode("utf-8", "replace")))
        if cut:
            _, end, name = min(cut)  # the first one in the file
            more = f"; {len(cut) - 1} tensors after it are cut too" if len(cut) > 1 else ""
            raise GGUFTruncated(f"{self._path}: truncated GGUF file: tensor {name} runs past the end "
                                f"(needs byte {end}, the file has {size}{more})")
        super()._build_tensors(start_offs, fields)


class GGUFTruncated(ValueError):
    """A GGUF file that ends before its metadata or a tensor does; the message names which."""


def read_fields(reader: gguf.GGUFReader) -> dict[str, Any]:
    """Metadata key -> Python value (strings, numbers, lists)."""
    return {key: field.contents() for key, field in reader.fields.items()}


def hf_config(fields: dict[str, Any], tensor_names: set[str], path: str | Path = "GGUF file") -> dict:
    """The HF config.json dict the GGUF metadata describes; `GGUFMissingKey` for a required key
    (`REQUIRED_KEYS`, `tokenizer.ggml.tokens`) that `fields` lacks."""
    arch = fields.get("general.architecture")
    if arch not in _ARCHS:
        raise ValueError(f"unsupported GGUF architecture general.architecture={arch!r}; "
                         f"supported are {sorted(_ARCHS)}")
    for key in (*(f"{arch}.{k}" for k in REQUIRED_KEYS), TOKENS_KEY):
        if fields.get(key) is None:
            raise GGUFMissingKey(path, key)

    def get(key: str, default: Any = None) -> Any:
        return fields.get(f"{arch}.{key}", default)

    heads = get("attention.head_count")
    hidden = get("embedding_length")
    config = {
        "model_type": _ARCHS[arch],
        "vocab_size": get("vocab_size") or len(fields["tokenizer.ggml.tokens"]),
        "hidden_size": hidden,
        "intermediate_size": get("feed_forward_length"),
        "num_hidden_layers": get("block_count"),
        "num_attention_heads": heads,
        "num_key_value_heads": get("attention.head_count_kv", heads),
        "head_dim": get("attention.key_length") or hidden // heads,
        "rope_theta": float(get("rope.freq_base", 10000.0)),
        "rms_norm_eps": float(get("attention.layer_norm_rms_epsilon", 1e-6)),
        "max_position_embeddings": get("context_length", 2048),
        "tie_word_embeddings": "output.weight" not in tensor_names,
        "bos_token_id": fields.get("tokenizer.ggml.bos_token_id"),
        "eos_token_id": fields.get("tokenizer.ggml.eos_token_id"),
    }
    scaling = get("rope.scaling.type")
    if scaling not in (None, "none"):
        if scaling not in ("linear", "yarn"):
            raise ValueError(f"unsupported GGUF {arch}.rope.scaling.type={scaling!r}")
        config["rope_scaling"] = {"rope_type": scaling, "factor": float(get("rope.scaling.factor")),
                                  "original_max_position_embeddings":
                                      get("rope.scaling.original_context_length")}
    if "rope_freqs.weight" in tensor_names:
        raise ValueError("unsupported GGUF tensor rope_freqs.weight (llama3 rope as a tensor)")
    return config


def _unpermute(w: np.ndarray, heads: int) -> np.ndarray:
    """Undo llama.cpp's `permute` of q/k rows: per head, interleaved pairs -> two halves."""
    rows = w.shape[0]
    return w.reshape(heads, rows // heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def dequantize(tensor: gguf.ReaderTensor) -> np.ndarray:
    """float32 array in numpy (row-major, HF) order; GGUF lists dims fastest-first."""
    shape = tuple(int(d) for d in reversed(tensor.shape))
    try:
        values = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
    except NotImplementedError as e:
        raise ValueError(f"GGUF tensor {tensor.name}: quantization {tensor.tensor_type.name} "
                         f"is not supported ({e})") from None
    return np.asarray(values, dtype=np.float32).reshape(shape)


def read_gguf_header(path: str | Path) -> tuple[gguf.GGUFReader, dict[str, Any], dict]:
    """(reader, metadata fields, HF config dict) of a GGUF file, without reading a tensor's data:
    what a start-up check needs (job/preflight.py) and where `read_gguf` starts."""
    reader = _CheckedReader(path)
    fields = read_fields(reader)
    return reader, fields, hf_config(fields, {t.name for t in reader.tensors}, path)


def read_gguf(path: str | Path) -> tuple[dict, dict[str, np.ndarray], dict[str, Any]]:
    """(HF config dict, HF-named float32 tensors, metadata fields) of a GGUF file."""
    reader, fields, config = read_gguf_header(path)
    tensors = {}
    for tensor in reader.tensors:
        name = _hf_name(tensor.name)
        value = dequantize(tensor)
        if fields["general.architecture"] in _PERMUTED_QK:
            if name.endswith("q_proj.weight"):
                value = _unpermute(value, config["num_attention_heads"])
            elif name.endswith("k_proj.weight"):
                value = _unpermute(value, config["num_key_value_heads"])
        tensors[name] = value
    return config, tensors, fields


def _hf_name(name: str) -> str:
    if name in _TOP_NAMES:
        return _TOP_NAMES[name]
    parts = name.split(".", 2)
    if parts[0] == "blk" and len(parts) == 3 and parts[2] in _TENSOR_NAMES:
        return f"model.layers.{parts[1]}.{_TENSOR_NAMES[parts[2]]}"
    raise ValueError(f"unexpected GGUF tensor {name}: no HF equivalent is known")
