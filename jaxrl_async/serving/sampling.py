"""What both routes share: the served model's facts (`ServedModel`), the sampling keys read from
request JSON into the engine's `SamplingParams`, and the engine's limits checked in the client's
words.

vLLM's `SamplingParams` (what `/inference/v1/generate` takes under `sampling_params`, and what
its chat route takes at the top level) has many keys; the engines sample with temperature,
top-p and top-k only. So every key falls in one of three sets, and nothing is silently dropped:

- `SAMPLING`: read (n, temperature, top_p, top_k, seed, max_tokens, stop_token_ids, ignore_eos;
  the routes read their own `logprobs`);
- `FORMATTING`: accepted with any value; they shape the text or the response, not the tokens;
- `NEUTRAL`: accepted only at the value that leaves sampling unchanged (a repetition penalty of
  1, no stop strings, ...); any other value is refused, since the engines cannot honour it.

A key in none of them is refused too. Every refusal is a one-line ValueError `key=value: rule`
that names the key as the client wrote it (the server answers HTTP 400 with it).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from jaxrl_async.engines.base import RequestLimits, SamplingParams
from jaxrl_async.tokenizer import Tokenizer
from planner.configs import check


@dataclass(frozen=True)
class ServedModel:
    """What the routes read of the model being served.

    Attributes:
      name: the model id clients send as `model` (`/v1/models` lists it).
      root: where the weights came from (`model.source`).
      tokenizer: renders chat messages and decodes completions.
      stop_token_ids: the model's own stop tokens, added to every request's (vLLM's EOS rule).
      limits: the engine's request limits (context, samples, vocabulary).
    """

    name: str
    root: str
    tokenizer: Tokenizer
    stop_token_ids: tuple[int, ...]
    limits: RequestLimits


class ModelNotFound(ValueError):
    """The request names a model this server does not serve (HTTP 404, as vLLM answers)."""


def check_model(value: Any, served: ServedModel) -> None:
    """A request's `model` must be the served name (or left out)."""
    if value is not None and value != served.name:
        raise ModelNotFound(f"model={value!r}: this server serves {served.name!r} only (GET /v1/models)")

SAMPLING = ("n", "temperature", "top_p", "top_k", "seed", "max_tokens", "stop_token_ids", "ignore_eos", "logprobs")
FORMATTING = ("skip_special_tokens", "spaces_between_special_tokens", "detokenize", "include_stop_str_in_output",
              "output_kind", "flat_logprobs", "return_token_ids",
              "routed_experts_prompt_start")  # verifiers sends it on a bridged turn; a dense model routes nothing
# key -> the values that leave sampling unchanged
NEUTRAL: dict[str, tuple[Any, ...]] = {
    "presence_penalty": (None, 0, 0.0), "frequency_penalty": (None, 0, 0.0), "repetition_penalty": (None, 1, 1.0),
    "min_p": (None, 0, 0.0), "min_tokens": (None, 0), "stop": (None, [], ""), "prompt_logprobs": (None,),
    "logit_bias": (None, {}), "allowed_token_ids": (None,), "bad_words": (None, []), "structured_outputs": (None,),
    "truncate_prompt_tokens": (None,), "extra_args": (None, {}), "logits_processors": (None, []),
    "length_penalty": (None, 1, 1.0),
}


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool)) and math.isfinite(value)


def check_known(values: Mapping[str, Any], prefix: str, own: tuple[str, ...] = ()) -> None:
    """Refuse a key no set above (nor the route's `own` keys) holds, and a `NEUTRAL` key at
    another value."""
    for key, value in values.items():
        if key in NEUTRAL:
            check(value in NEUTRAL[key], f"{prefix}{key}", value,
                  f"not supported by this server (the engines sample with temperature, top_p and top_k only); "
                  f"leave it out or set {NEUTRAL[key][-1]!r}")
        else:
            check(key in SAMPLING or key in FORMATTING or key in own, f"{prefix}{key}", value,
                  "unknown key for this server")


def read_sampling(values: Mapping[str, Any], prefix: str, *, prompt_len: int, context: int,
                  stop_token_ids: tuple[int, ...]) -> SamplingParams:
    """The engine's `SamplingParams` from a request's sampling keys (`prefix` names their place in
    the JSON: "sampling_params." or ""), with vLLM's defaults: temperature 1, max_tokens up to the
    context, and the model's `stop_token_ids` added unless `ignore_eos`."""
    def get(key: str, default: Any) -> Any:
        value = values.get(key)
        return default if value is None else value

    n = get("n", 1)
    check(is_int(n) and n >= 1, f"{prefix}n", n, "must be an int >= 1")
    temperature = get("temperature", 1.0)
    check(is_number(temperature) and temperature >= 0, f"{prefix}temperature", temperature,
          "must be a number >= 0 (0 = greedy)")
    top_p = get("top_p", 1.0)
    check(is_number(top_p) and 0 < top_p <= 1, f"{prefix}top_p", top_p, "must be a number in (0, 1]")
    top_k = get("top_k", 0)
    check(is_int(top_k) and top_k >= -1, f"{prefix}top_k", top_k, "must be an int >= 1, or 0 or -1 (off)")
    seed = values.get("seed")
    check(seed is None or (is_int(seed) and 0 <= seed < 2**32), f"{prefix}seed", seed,
          "must be null or an int in [0, 2**32)")
    room = context - prompt_len
    max_tokens = get("max_tokens", room)  # vLLM's default: whatever the context leaves
    check(is_int(max_tokens) and max_tokens >= 1, f"{prefix}max_tokens", max_tokens,
          f"must be an int >= 1 (the prompt of {prompt_len} tokens leaves {room} of the context {context})")
    stops = get("stop_token_ids", [])
    check(isinstance(stops, list) and all(is_int(t) and t >= 0 for t in stops), f"{prefix}stop_token_ids", stops,
          "must be a list of token ids")
    ignore_eos = get("ignore_eos", False)
    check(isinstance(ignore_eos, bool), f"{prefix}ignore_eos", ignore_eos, "must be true or false")
    stops = [*stops, *(() if ignore_eos else stop_token_ids)]
    return SamplingParams(max_new_tokens=max_tokens, temperature=float(temperature), top_p=float(top_p),
                          top_k=max(top_k, 0), stop_token_ids=tuple(dict.fromkeys(stops)), n=n, seed=seed)


def check_prompt(prompt_ids: Any, key: str, limits: RequestLimits) -> list[int]:
    """The prompt's token ids: a non-empty list of ids in the vocabulary that leaves room in the
    context for at least one new token."""
    check(isinstance(prompt_ids, list) and prompt_ids and all(is_int(t) for t in prompt_ids), key,
          _short(prompt_ids), "must be a non-empty list of token ids")
    bad = next((t for t in prompt_ids if not 0 <= t < limits.vocab_size), None)
    check(bad is None, key, _short(prompt_ids), f"token id {bad} is outside the vocabulary [0, {limits.vocab_size})")
    check(len(prompt_ids) < limits.context, key, _short(prompt_ids),
          f"a prompt of {len(prompt_ids)} tokens leaves no room in the context {limits.context_key}={limits.context}")
    return prompt_ids


def check_fits(sampling: SamplingParams, prompt_len: int, prefix: str, limits: RequestLimits) -> None:
    """The engine's `RequestLimits` rule, naming the request's keys: prompt + max_tokens within
    the context, n within the samples decoded together."""
    need = prompt_len + sampling.max_new_tokens
    check(need <= limits.context, f"{prefix}max_tokens", sampling.max_new_tokens,
          f"a prompt of {prompt_len} tokens + max_tokens = {need} exceeds the context "
          f"{limits.context_key}={limits.context}")
    check(sampling.n <= limits.samples, f"{prefix}n", sampling.n,
          f"exceeds {limits.samples_key}={limits.samples} (a request's samples decode together)")


def _short(value: Any) -> Any:
    """A long token list shown by its head (the error stays one readable line)."""
    return value[:8] + ["..."] if isinstance(value, list) and len(value) > 8 else value
