"""Hugging Face tensor names <-> the stacked parameters of `Transformer`.

One table (`_PARAMS`) says, for every parameter, its HF name and how its layout differs (HF
linear weights are `[out, in]`; ours are `[in, heads, head_dim]`-style einsum operands, stacked
over layers). Loading checks every tensor — missing, unexpected, wrong shape — before anything is
written into the model; saving (`to_hf_state_dict`, `save_hf`) is the same table run backwards,
and is what the vLLM weight push streams. A truncated or corrupt .safetensors file is a one-line
ValueError naming the file.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from safetensors import SafetensorError, safe_open
from safetensors.numpy import save_file

from jaxrl_async.models.config import ModelConfig
from jaxrl_async.models.transformer import Transformer
from jaxrl_async.trees import path_str

ADAPTER_WEIGHTS = "adapter_model.safetensors"  # PEFT's file name (models/peft_adapter.py)

# Layouts: how an HF tensor maps to our (per-layer) array.
#   copy         same shape
#   linear       HF [out, in]      -> ours [in, out]
#   heads_out    HF [H*D, E]       -> ours [E, H, D]   (q/k/v projections)
#   heads_in     HF [E, H*D]       -> ours [H, D, E]   (o projection)
#   heads_bias   HF [H*D]          -> ours [H, D]
_LAYER_PARAMS = {  # our name in DecoderLayers -> (HF name inside model.layers.{i}., layout)
    "attn_norm": ("input_layernorm.weight", "copy"),
    "wq": ("self_attn.q_proj.weight", "heads_out"),
    "wk": ("self_attn.k_proj.weight", "heads_out"),
    "wv": ("self_attn.v_proj.weight", "heads_out"),
    "wo": ("self_attn.o_proj.weight", "heads_in"),
    "bq": ("self_attn.q_proj.bias", "heads_bias"),
    "bk": ("self_attn.k_proj.bias", "heads_bias"),
    "bv": ("self_attn.v_proj.bias", "heads_bias"),
    "q_norm": ("self_attn.q_norm.weight", "copy"),
    "k_norm": ("self_attn.k_norm.weight", "copy"),
    "mlp_norm": ("post_attention_layernorm.weight", "copy"),
    "w_gate": ("mlp.gate_proj.weight", "linear"),
    "w_up": ("mlp.up_proj.weight", "linear"),
    "w_down": ("mlp.down_proj.weight", "linear"),
}
_TOP_PARAMS = {
    "embed": ("model.embed_tokens.weight", "copy"),
    "final_norm": ("model.norm.weight", "copy"),
    "lm_head": ("lm_head.weight", "linear"),
}


def hf_module(param: str) -> str:
    """The HF module inside `model.layers.{i}.` that holds our layer param (`wq` ->
    `self_attn.q_proj`): where a PEFT adapter of that projection lives (models/peft_adapter.py)."""
    return _LAYER_PARAMS[param][0].removesuffix(".weight")


def _to_hf(x: np.ndarray, layout: str) -> np.ndarray:
    if layout == "copy":
        return x
    if layout == "linear":
        return x.T
    if layout == "heads_out":
        return x.reshape(x.shape[0], -1).T
    if layout == "heads_in":
        return x.reshape(-1, x.shape[-1]).T
    if layout == "heads_bias":
        return x.reshape(-1)
    raise AssertionError(layout)


def _from_hf(x: np.ndarray, layout: str, shape: tuple[int, ...]) -> np.ndarray:
    if layout == "copy":
        return x
    if layout == "linear":
        return x.T
    if layout in ("heads_out", "heads_in"):
        return x.T.reshape(shape)
    if layout == "heads_bias":
        return x.reshape(shape)
    raise AssertionError(layout)


def _hf_shape(shape: tuple[int, ...], layout: str) -> tuple[int, ...]:
    return _to_hf(np.empty(shape, np.bool_), layout).shape


def _param_vars(model_or_state) -> dict[str, nnx.Variable | jax.Array]:
    """Our parameter path ('embed', 'layers/wq', ...) -> its Variable (or array, for a pure dict)."""
    state = nnx.state(model_or_state, nnx.Param) if isinstance(model_or_state, nnx.Module) \
        else model_or_state
    leaves = jax.tree_util.tree_flatten_with_path(
        state, is_leaf=lambda x: isinstance(x, nnx.Variable))[0]
    return {path_str(path): leaf for path, leaf in leaves}


def _hf_names(cfg: ModelConfig, path: str) -> list[tuple[str, str]]:
    """HF names (one per layer for stacked params) and the layout of our param `path`."""
    if path.startswith("layers/"):
        hf, layout = _LAYER_PARAMS[path.split("/", 1)[1]]
        return [(f"model.layers.{i}.{hf}", layout) for i in range(cfg.num_layers)]
    return [_TOP_PARAMS[path]]


def to_hf_state_dict(model_or_state, cfg: ModelConfig) -> dict[str, np.ndarray]:
    """HF tensor name -> numpy array (the model's dtype; bfloat16 as ml_dtypes.bfloat16).

    Takes a Transformer, its `nnx.State`, or that state as a pure dict (`state.to_pure_dict()`).
    """
    out = {}
    for path, var in _param_vars(model_or_state).items():
        value = var.get_value() if isinstance(var, nnx.Variable) else var
        value = np.asarray(jax.device_get(value))
        names = _hf_names(cfg, path)
        for i, (name, layout) in enumerate(names):
            per_layer = value[i] if path.startswith("layers/") else value
            out[name] = np.ascontiguousarray(_to_hf(per_layer, layout))
    return out


def load_hf_state_dict(model: Transformer, tensors: Mapping[str, np.ndarray]) -> None:
    """Write HF-named `tensors` into `model` after checking every one (names and shapes)."""
    cfg = model.cfg
    params = _param_vars(model)
    expected: dict[str, tuple[str, int | None, str, tuple[int, ...]]] = {}
    for path, var in params.items():
        stacked = path.startswith("layers/")
        shape = var.get_value().shape[1:] if stacked else var.get_value().shape
        for i, (name, layout) in enumerate(_hf_names(cfg, path)):
            expected[name] = (path, i if stacked else None, layout, shape)
    ignorable = {"lm_head.weight"} if cfg.tie_word_embeddings else set()
    for name in tensors:
        if name not in expected and name not in ignorable and not name.endswith("rotary_emb.inv_freq"):
            raise ValueError(f"unexpected tensor {name} with shape {tuple(tensors[name].shape)}: "
                             f"the {_arch(cfg)} model has no such parameter")
    for name, (_, _, layout, shape) in expected.items():
        if name not in tensors:
            raise ValueError(f"missing tensor {name}: the model expects shape "
                             f"{_hf_shape(shape, layout)}")
        got, want = tuple(tensors[name].shape), _hf_shape(shape, layout)
        if got != want:
            raise ValueError(f"tensor {name}: shape {got} in the checkpoint, the model expects {want}")
    for path, var in params.items():
        names = _hf_names(cfg, path)
        shape = var.get_value().shape[1:] if path.startswith("layers/") else var.get_value().shape
        arrays = [_from_hf(np.asarray(tensors[n]), layout, shape) for n, layout in names]
        value = np.stack(arrays) if path.startswith("layers/") else arrays[0]
        var.set_value(jnp.asarray(value, dtype=var.get_value().dtype))


def _arch(cfg: ModelConfig) -> str:
    return cfg.to_hf()["model_type"]


def read_safetensors(directory: str | Path) -> dict[str, np.ndarray]:
    """All tensors of a HF directory, sharded (`model.safetensors.index.json`) or not."""
    directory = Path(directory)
    index = directory / "model.safetensors.index.json"
    if index.exists():
        files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    else:  # a LoRA run's hf/ also holds its PEFT adapter: not the model's weights
        files = sorted(p.name for p in directory.glob("*.safetensors") if p.name != ADAPTER_WEIGHTS)
    if not files:
        raise ValueError(f"no *.safetensors in {directory}")
    tensors = {}
    for file in files:
        path = directory / file
        try:  # a truncated or corrupt file fails in the Rust reader with a message naming no file
            with safe_open(str(path), framework="numpy") as f:
                for name in f.keys():
                    tensors[name] = f.get_tensor(name)
        except SafetensorError as e:
            raise ValueError(f"{path}: not a readable safetensors file, truncated or corrupt ({e})") from None
    return tensors


def save_hf(model: Transformer, cfg: ModelConfig, out_dir: str | Path, tokenizer=None) -> Path:
    """Write config.json + model.safetensors (+ tokenizer files) in the HF layout and names."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "config.json").write_text(json.dumps(cfg.to_hf(), indent=2))
    tensors = to_hf_state_dict(model, cfg)
    save_file(tensors, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    if tokenizer is not None:
        tokenizer.backend.save(str(out_dir / "tokenizer.json"))
        token = tokenizer.id_to_token
        config = {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "bos_token": None if tokenizer.bos_token_id is None else token(tokenizer.bos_token_id),
            "eos_token": token(tokenizer.eos_token_ids[0]) if tokenizer.eos_token_ids else None,
            "pad_token": None if tokenizer.pad_token_id is None else token(tokenizer.pad_token_id),
            "add_bos_token": tokenizer.add_bos,
            "chat_template": tokenizer.chat_template,
        }
        (out_dir / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
    return out_dir

