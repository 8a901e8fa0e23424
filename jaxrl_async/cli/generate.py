"""`python -m jaxrl_async.generate [overrides]`: complete one prompt with the native JAX engine.

    python -m jaxrl_async.generate model=smollm2_135m prompt="What is 2+2?" max_new_tokens=32 \
        temperature=0 output=json

Hydra composes `conf/generate.yaml` (group: model; `model.source=PATH` takes a HF directory or
a .gguf file). The prompt goes through the model's chat template as one user message unless
`chat=false` or the tokenizer has none. `output=text` prints the completion; `output=json`
prints exactly one JSON object (docs/design.md §8):
`{"prompt_ids", "token_ids", "text", "logprobs", "finish_reason"}`. Bad input — an unknown model
or key, a bad value, a prompt that does not fit the model's context — is one line on stderr and
exit status 1. While it loads the model and compiles, it says so on stderr; stdout holds only
the output above.

The engine takes the same `engine.*` keys as training's JAX engine (`EngineConfig`, e.g.
`engine.page_size=16` for the paged KV cache), except that its max_len is the prompt plus
max_new_tokens (rounded up to whole pages when paged) and its min_bucket at most that.

The command line's plumbing (compose, type, one-line errors, status lines) is cli/common.py's.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from jaxrl_async.cli.common import note, run_cached, run_command
from jaxrl_async.engines.jax.config import EngineConfig
from jaxrl_async.models.config import ModelSpec
from planner.configs import build, check

# The engine core and the model import JAX: `generate` imports them where the work starts, so
# that `--help` (which reads GenerateConfig) stays free of them.
SUMMARY = __doc__.splitlines()[0].split(": ", 1)[1]  # the first line of --help

OUTPUTS = ("text", "json")


@dataclass(frozen=True)
class GenerateConfig:
    """`python -m jaxrl_async.generate`'s top-level keys, with their defaults (`--help` lists them).

    Attributes:
      model: the `model=` group: a registered name, a HF directory or a .gguf file
      prompt: the text to complete (wrapped in the chat template when `chat`)
      max_new_tokens: longest completion
      temperature: 0 = greedy
      top_p: nucleus sampling; 1.0 = off
      top_k: 0 = off
      seed: the sampling seed
      chat: apply the chat template when the tokenizer has one
      output: "text": print the completion | "json": one JSON object
      engine: The JAX engine's keys (one slot: one prompt); max_len and min_bucket follow the
        prompt.
    """

    model: ModelSpec
    prompt: str = "Hello"
    max_new_tokens: int = 32
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int = 0
    chat: bool = True
    output: str = "text"
    engine: EngineConfig = field(default_factory=lambda: EngineConfig(num_slots=1))

    def __post_init__(self) -> None:
        check(self.output in OUTPUTS, "output", self.output, f"must be one of {OUTPUTS}")
        check(isinstance(self.chat, bool), "chat", self.chat, "must be true or false")


def typed_config(cfg: dict[str, Any]) -> GenerateConfig:
    """The composed `conf/generate.yaml` -> `GenerateConfig`; every problem is a one-line ValueError."""
    model = cfg.get("model")
    check(isinstance(model, dict) and "source" in model, "model", model,
          "choose one with model=NAME (conf/model/*.yaml)")
    return build(GenerateConfig, {**cfg, "model": {**model, "source": str(model["source"])}}, "")


def generate(config: GenerateConfig, *, say: Callable[[str], None] = lambda _: None) -> dict[str, Any]:
    """Load the model, run the prompt through an engine core of one slot, return the result;
    `say` gets a status line before each slow phase (the command line prints them on stderr)."""
    from jaxrl_async.engines.base import GenerationRequest, SamplingParams
    from jaxrl_async.engines.jax.engine import make_core
    from jaxrl_async.models.loading import load_model

    say(f"loading model {config.model.source} ...")
    loaded = load_model(config.model.source, dtype=config.model.dtype, adapter=config.model.adapter)
    tok = loaded.tokenizer
    if tok is None:
        raise ValueError(f"model.source={config.model.source!r}: has no tokenizer.json; cannot encode a text prompt")
    if config.chat and tok.chat_template:
        text = tok.apply_chat_template([{"role": "user", "content": config.prompt}])
        prompt_ids = tok.encode(text, add_bos=False)  # the template writes its own specials
    else:
        prompt_ids = tok.encode(config.prompt)
    sampling = SamplingParams(
        max_new_tokens=config.max_new_tokens, temperature=config.temperature, top_p=config.top_p,
        top_k=config.top_k, seed=config.seed,
        stop_token_ids=loaded.stop_token_ids)
    need = len(prompt_ids) + config.max_new_tokens
    context = loaded.cfg.max_position_embeddings
    if need > context:
        raise ValueError(f"prompt of {len(prompt_ids)} tokens + max_new_tokens={config.max_new_tokens} "
                         f"= {need} exceeds the model's context max_position_embeddings={context}")
    page = config.engine.page_size
    max_len = -(-need // page) * page if page else need
    engine = dataclasses.replace(config.engine, max_len=max_len, min_bucket=min(config.engine.min_bucket, max_len))
    core = make_core(loaded.model, loaded.cfg, engine)
    core.submit(GenerationRequest("prompt", prompt_ids, sampling))
    say(f"compiling and generating up to {config.max_new_tokens} tokens ...")
    outputs = []
    while core.has_work():
        outputs += core.step()
    (out,) = outputs
    return {"prompt_ids": prompt_ids, "token_ids": out.token_ids,
            "text": tok.decode(out.token_ids), "logprobs": out.logprobs,
            "finish_reason": out.finish_reason}


def main(argv: list[str] | None = None) -> int:
    return run_command("generate", SUMMARY, GenerateConfig, argv, typed_config,
                       lambda config: generate(config, say=note),
                       lambda config, result: (json.dumps(result) if config.output == "json" else result["text"]) + "\n")


def run() -> None:
    """`python -m` entry (this module's and the jaxrl_async/generate.py shim's)."""
    run_cached(main)


if __name__ == "__main__":
    run()
