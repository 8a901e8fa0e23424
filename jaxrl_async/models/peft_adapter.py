"""LoRA adapters in PEFT's format: `adapter_config.json` + `adapter_model.safetensors`.

What `peft.PeftModel.from_pretrained(base, DIR)` loads onto a `LlamaForCausalLM` / `Qwen2ForCausalLM`
/ `Qwen3ForCausalLM` (the names follow the HF model, models/hf_weights.py): for projection `p` of
layer i, `base_model.model.model.layers.{i}.{self_attn|mlp}.{p}.lora_A.weight` [r, in] and
`...lora_B.weight` [out, r], with `lora_alpha / r` as the scale (rsLoRA's alpha / sqrt(r) when the
config says `use_rslora`). Ours (models/lora.py) are A [L, *in, r] and B [L, r, *out]: the same
matrices transposed, with the layer and head axes folded.

A LoRA run writes one into its `hf/` beside the base model's weights (job/report.py): transformers'
`AutoModelForCausalLM.from_pretrained(hf/)` then loads the base and applies the adapter (with
`peft` installed), and `model.adapter=DIR` merges it here (models/loading.py). Reading checks
every tensor against the model's config before anything is merged: a key that names no module, a
layer the model lacks, a shape of another base model or a rank other than the config's is one
line naming `model.adapter`.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
from safetensors import SafetensorError, safe_open
from safetensors.numpy import save_file

from jaxrl_async.models.config import PROJECTIONS, ModelConfig
from jaxrl_async.models.hf_weights import ADAPTER_WEIGHTS, hf_module
from jaxrl_async.models.lora import TARGETS, LoraAdapter
from jaxrl_async.models.transformer import layer_shapes

ADAPTER_CONFIG = "adapter_config.json"
_PREFIX = "base_model.model.model.layers."
_KEY = re.compile(r"^base_model\.model\.model\.layers\.(\d+)\.(\w+)\.(\w+)\.lora_([AB])\.weight$")


def _folds(cfg: ModelConfig, target: str) -> tuple[str, tuple[int, ...], tuple[int, ...]]:
    """(our param, one layer's input axes, output axes) of a target projection."""
    name, in_axes = TARGETS[target]
    shape = layer_shapes(cfg)[name][1:]
    return name, shape[:in_axes], shape[in_axes:]


def peft_tensors(adapter: LoraAdapter, cfg: ModelConfig) -> dict[str, np.ndarray]:
    """PEFT key -> float32 array ([r, in] for A, [out, r] for B), every layer of every target."""
    out = {}
    for name, ab in adapter.params["layers"].items():
        a, b = np.asarray(ab["a"], np.float32), np.asarray(ab["b"], np.float32)
        rank = a.shape[-1]
        module = hf_module(name)
        for i in range(cfg.num_layers):
            out[f"{_PREFIX}{i}.{module}.lora_A.weight"] = np.ascontiguousarray(a[i].reshape(-1, rank).T)
            out[f"{_PREFIX}{i}.{module}.lora_B.weight"] = np.ascontiguousarray(b[i].reshape(rank, -1).T)
    return out


def save_peft(adapter: LoraAdapter, cfg: ModelConfig, out_dir: str | Path, *, alpha: float,
              base_model: str) -> Path:
    """Write `adapter_config.json` + `adapter_model.safetensors` into `out_dir`."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    by_param = {name: target for target, (name, _) in TARGETS.items()}
    config = {
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": base_model,
        "r": adapter.rank, "lora_alpha": alpha, "lora_dropout": 0.0, "bias": "none",
        "target_modules": sorted(by_param[name] for name in adapter.params["layers"]),
        "fan_in_fan_out": False, "use_rslora": False, "inference_mode": True,
    }
    (out_dir / ADAPTER_CONFIG).write_text(json.dumps(config, indent=2))
    save_file(peft_tensors(adapter, cfg), str(out_dir / ADAPTER_WEIGHTS), metadata={"format": "pt"})
    return out_dir


def load_peft(directory: str | Path, cfg: ModelConfig, key: str = "model.adapter") -> LoraAdapter:
    """The PEFT adapter in `directory` as a float32 `LoraAdapter` for a model of `cfg`; every
    problem is a one-line ValueError starting `key=directory:`."""
    directory = Path(directory)
    where = f"{key}={str(directory)!r}"
    config_file, weights_file = directory / ADAPTER_CONFIG, directory / ADAPTER_WEIGHTS
    if not config_file.is_file() or not weights_file.is_file():
        raise ValueError(f"{where}: not a PEFT adapter directory (needs {ADAPTER_CONFIG} and {ADAPTER_WEIGHTS})")
    config = json.loads(config_file.read_text())
    if config.get("peft_type") != "LORA":
        raise ValueError(f"{where}: peft_type={config.get('peft_type')!r}; only LORA adapters are read")
    targets = config.get("target_modules")
    targets = [targets] if isinstance(targets, str) else list(targets or [])
    unknown = [t for t in targets if t not in PROJECTIONS]
    if unknown:
        raise ValueError(f"{where}: target module {unknown[0]!r} matches no module of this model "
                         f"(its projections: {', '.join(PROJECTIONS)})")
    rank, alpha = int(config["r"]), float(config["lora_alpha"])
    scale = alpha / math.sqrt(rank) if config.get("use_rslora") else alpha / rank
    try:
        with safe_open(str(weights_file), framework="numpy") as f:
            tensors = {name: f.get_tensor(name) for name in f.keys()}
    except SafetensorError as e:
        raise ValueError(f"{where}: {weights_file.name} is not a readable safetensors file ({e})") from None
    layers: dict[str, dict[str, np.ndarray]] = {}
    for name, value in tensors.items():
        found = _KEY.match(name)
        target = found and found.group(3)
        if not found or target not in PROJECTIONS or hf_module(TARGETS[target][0]) != f"{found.group(2)}.{target}":
            raise ValueError(f"{where}: tensor {name} names no LoRA weight of this model's projections")
        layer, which = int(found.group(1)), found.group(4)
        if layer >= cfg.num_layers:
            raise ValueError(f"{where}: tensor {name} is for layer {layer}; the model has {cfg.num_layers} layers")
        param, ins, outs = _folds(cfg, target)
        want = (rank, math.prod(ins)) if which == "A" else (math.prod(outs), rank)
        if tuple(value.shape) != want:
            raise ValueError(f"{where}: tensor {name} is {list(value.shape)}; a rank-{rank} adapter of this model's "
                             f"{target} is {list(want)} (an adapter for another base model or rank?)")
        stacked = layers.setdefault(param, {
            "a": np.zeros((cfg.num_layers, *ins, rank), np.float32),
            "b": np.zeros((cfg.num_layers, rank, *outs), np.float32)})
        if which == "A":
            stacked["a"][layer] = value.astype(np.float32).T.reshape(*ins, rank)
        else:
            stacked["b"][layer] = value.astype(np.float32).T.reshape(rank, *outs)
    if not layers:
        raise ValueError(f"{where}: {weights_file.name} holds no LoRA weights")
    return LoraAdapter({"layers": layers}, scale)


def check_adapter_dir(directory: str | Path, cfg: ModelConfig, key: str = "model.adapter") -> None:
    """`load_peft`'s checks alone (the run's preflight: before anything is written)."""
    load_peft(directory, cfg, key)
