"""Model hyper-parameters for the Llama / Qwen2 / Qwen3 decoder family, and the `model=` group.

One frozen dataclass describes every supported model; `from_hf` reads a Hugging Face
`config.json` dict and `tiny` makes a small random model for tests and demos. `ModelSpec` is
the `model=` group: which model `load_model` (loading.py) loads. No JAX here: `--help` reads it. To support another
architecture, add its `model_type` to `_ARCH_FLAGS` with the flags that distinguish it, and teach
`transformer.py` (or `rope.py`, `attention.py`) whatever it needs that the flags cannot express.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any

# model_type -> the flags that distinguish it from plain Llama. Qwen2 always has q/k/v biases;
# Qwen3 has per-head q/k RMSNorm and takes `attention_bias` from its config.
_ARCH_FLAGS: dict[str, dict[str, Any]] = {
    "llama": {},
    "qwen2": {"attention_bias": True},
    "qwen3": {"qk_norm": True},
}
_ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
}
ROPE_TYPES = ("default", "linear", "dynamic", "llama3", "yarn")
# The linear projections of every decoder layer, by their HF module names: what a LoRA adapter
# (`trainer.lora.targets`, models/lora.py) and PEFT's `target_modules` name.
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
DTYPES = ("float32", "bfloat16")


@dataclass(frozen=True)
class ModelConfig:
    """Shape and numerics of a decoder-only LM (names follow the HF Llama config).

    Attributes:
      vocab_size: token ids the embedding and the LM head cover.
      hidden_size: width of the residual stream.
      intermediate_size: width of the SwiGLU MLP's hidden layer.
      num_layers: decoder blocks.
      num_heads: query heads per layer.
      num_kv_heads: key/value heads per layer (grouped-query attention when < num_heads).
      head_dim: width of one attention head.
      rope_theta: RoPE base frequency.
      rope_scaling: HF `rope_scaling` / `rope_parameters` without `rope_theta`: {"rope_type":
        "llama3", ...}.
      rms_norm_eps: added to the mean square in every RMSNorm.
      tie_word_embeddings: the LM head reuses the embedding matrix.
      attention_bias: Qwen2: biases on the q/k/v projections
      qk_norm: Qwen3: per-head RMSNorm on q and k before RoPE
      max_position_embeddings: the context length the model was trained for.
      dtype: activations and parameters: "float32" | "bfloat16"
      bos_token_id: prepended to a prompt without a chat template; None: none.
      eos_token_ids: ids that end a completion.
    """

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    qk_norm: bool = False
    max_position_embeddings: int = 2048
    dtype: str = "float32"
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads",
                     "num_kv_heads", "head_dim", "max_position_embeddings"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"ModelConfig.{name}={value!r}: must be a positive int")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"ModelConfig.num_heads={self.num_heads} is not a multiple of "
                f"num_kv_heads={self.num_kv_heads} (grouped-query attention needs whole groups)")
        if self.head_dim % 2:
            raise ValueError(f"ModelConfig.head_dim={self.head_dim}: RoPE needs an even head_dim")
        if self.dtype not in DTYPES:
            raise ValueError(f"ModelConfig.dtype={self.dtype!r}: must be one of {DTYPES}")
        if self.rope_scaling is not None:
            rope_type = self.rope_scaling.get("rope_type", self.rope_scaling.get("type"))
            if rope_type not in ROPE_TYPES:
                raise ValueError(
                    f"ModelConfig.rope_scaling rope_type={rope_type!r}: supported are {ROPE_TYPES}")
        object.__setattr__(self, "eos_token_ids", tuple(int(t) for t in self.eos_token_ids))

    def __hash__(self) -> int:
        # The config is a static attribute of the model graph, which jit hashes; the dict field
        # would make the generated hash fail.
        return hash(tuple(
            json.dumps(v, sort_keys=True) if isinstance(v, dict) else v
            for v in dataclasses.astuple(self)))

    @property
    def rope_type(self) -> str:
        if not self.rope_scaling:
            return "default"
        return self.rope_scaling.get("rope_type", self.rope_scaling.get("type", "default"))

    def replace(self, **changes: Any) -> ModelConfig:
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_hf(cls, hf_config: dict) -> ModelConfig:
        """Read a HF `config.json` (llama / qwen2 / qwen3); anything else is a ValueError."""
        model_type = hf_config.get("model_type")
        if model_type not in _ARCH_FLAGS:
            archs = hf_config.get("architectures") or []
            model_type = next((_ARCHITECTURES[a] for a in archs if a in _ARCHITECTURES), None)
        if model_type is None:
            raise ValueError(
                f"unsupported architecture: model_type={hf_config.get('model_type')!r} "
                f"architectures={hf_config.get('architectures')!r}; supported model_type are "
                f"{sorted(_ARCH_FLAGS)}")
        if hf_config.get("use_sliding_window"):
            raise ValueError(f"unsupported {model_type} config: use_sliding_window=True")
        if hf_config.get("mlp_bias"):
            raise ValueError(f"unsupported {model_type} config: mlp_bias=True")
        if hf_config.get("hidden_act", "silu") != "silu":
            raise ValueError(
                f"unsupported {model_type} config: hidden_act={hf_config['hidden_act']!r} "
                "(only silu / SwiGLU)")
        # transformers >= 5 writes `rope_parameters` (with rope_theta inside); older versions
        # write `rope_theta` and `rope_scaling` side by side.
        rope = dict(hf_config.get("rope_parameters") or hf_config.get("rope_scaling") or {})
        rope_theta = float(rope.pop("rope_theta", hf_config.get("rope_theta", 10000.0)))
        if "type" in rope and "rope_type" not in rope:
            rope["rope_type"] = rope.pop("type")
        if rope.get("rope_type", "default") == "default":
            rope = {}
        eos = hf_config.get("eos_token_id")
        eos_ids = () if eos is None else tuple(eos) if isinstance(eos, list) else (eos,)
        heads = hf_config["num_attention_heads"]
        flags = dict(_ARCH_FLAGS[model_type])
        if model_type == "qwen3":
            flags["attention_bias"] = bool(hf_config.get("attention_bias", False))
        elif model_type == "llama" and hf_config.get("attention_bias"):
            flags["attention_bias"] = True
        return cls(
            vocab_size=hf_config["vocab_size"],
            hidden_size=hf_config["hidden_size"],
            intermediate_size=hf_config["intermediate_size"],
            num_layers=hf_config["num_hidden_layers"],
            num_heads=heads,
            num_kv_heads=hf_config.get("num_key_value_heads") or heads,
            head_dim=hf_config.get("head_dim") or hf_config["hidden_size"] // heads,
            rope_theta=rope_theta,
            rope_scaling=rope or None,
            rms_norm_eps=float(hf_config.get("rms_norm_eps", 1e-6)),
            tie_word_embeddings=bool(hf_config.get("tie_word_embeddings", False)),
            max_position_embeddings=hf_config.get("max_position_embeddings", 2048),
            bos_token_id=hf_config.get("bos_token_id"),
            eos_token_ids=eos_ids,
            **flags,
        )

    def to_hf(self) -> dict:
        """The HF `config.json` dict (Llama, Qwen2 or Qwen3 by the flags) that `from_hf` reads back."""
        model_type = "qwen3" if self.qk_norm else "qwen2" if self.attention_bias else "llama"
        arch = {v: k for k, v in _ARCHITECTURES.items()}[model_type]
        rope = {"rope_theta": self.rope_theta, "rope_type": "default", **(self.rope_scaling or {})}
        eos = list(self.eos_token_ids)
        out = {
            "architectures": [arch],
            "model_type": model_type,
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "rms_norm_eps": self.rms_norm_eps,
            "tie_word_embeddings": self.tie_word_embeddings,
            "max_position_embeddings": self.max_position_embeddings,
            # Both spellings, so that transformers 4.x and 5.x (and vLLM) read the same rope.
            "rope_theta": self.rope_theta,
            "rope_scaling": self.rope_scaling,
            "rope_parameters": rope,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": eos[0] if len(eos) == 1 else (eos or None),
            "torch_dtype": self.dtype,
            "attention_bias": self.attention_bias,
        }
        return out

    @classmethod
    def tiny(cls, **overrides: Any) -> ModelConfig:
        """A 2-layer random model for tests and demos; its vocab matches `tokenizer.tiny_tokenizer`."""
        base = dict(
            vocab_size=264, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4,
            num_kv_heads=2, head_dim=16, max_position_embeddings=1024,
            bos_token_id=256, eos_token_ids=(257, 260))
        base.update(overrides)
        return cls(**base)


@dataclass(frozen=True)
class ModelSpec:
    """The `model=` group (`conf/model/*.yaml`): what `load_model` takes.

    Attributes:
      source: a registered name, a HF directory or a .gguf file
      dtype: the params' dtype; None = the source's own
      adapter: a PEFT LoRA adapter directory (adapter_config.json + adapter_model.safetensors, e.g.
        a LoRA run's hf/) merged into the source's weights when loaded; None = none
    """

    source: str
    dtype: str | None = None
    adapter: str | None = None
