"""The token-in/token-out route, `POST /inference/v1/generate`: vLLM's schema, as verifiers'
`TrainClient` (through `renderers.client.generate`) calls it.

Request (JSON object):
  token_ids        the prompt's token ids (the client rendered the chat template)
  sampling_params  vLLM's sampling keys (sampling.py: n, temperature, top_p, top_k, seed,
                   max_tokens, stop_token_ids, ignore_eos, logprobs, ...)
  model            optional; must be the served name
  request_id       optional; echoed back (the engine runs under the server's own id)
  priority         optional int, lower first (the engine's admission order)
  cache_salt       accepted (the engines keep no prefix cache across requests)
  stream           false only; features, kv_transfer_params: null only
Response:
  {"request_id", "choices": [{"index", "token_ids", "logprobs", "finish_reason",
   "token_versions"}], "prompt_logprobs": null, "kv_transfer_params": null}
  where `logprobs` is {"content": [{"token": "token_id:<id>", "logprob", "bytes": null,
  "top_logprobs": []}, ...]} when sampling_params.logprobs is set, else null. Each log-prob is the
  behaviour policy's (engines/base.py `SampleOutput.logprobs`: temperature 1, before top-p/top-k),
  which is what training needs; `top_logprobs` stays empty because the engines compute the
  sampled token's log-prob only. `token_versions` (this server's addition) is the weight version
  that sampled each token, one per token id. `finish_reason` is "stop", "length" or "abort".
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from jaxrl_async.engines.base import SampleOutput, SamplingParams
from jaxrl_async.serving.sampling import (ServedModel, check_fits, check_known, check_model, check_prompt, is_int,
                                          read_sampling)
from planner.configs import check
from planner.versions import decode_runs

# The top-level keys beside `sampling_params`, and the values they must have when the server
# cannot act on them.
OWN = ("model", "token_ids", "sampling_params", "request_id", "priority", "cache_salt", "stream",
       "stream_options", "features", "kv_transfer_params")


@dataclass(frozen=True)
class TokenRequest:
    """A checked `/inference/v1/generate` request."""

    request_id: str | None  # the client's, echoed back
    prompt_ids: list[int]
    sampling: SamplingParams
    priority: float
    logprobs: bool  # return the log-probs (vLLM: only when sampling_params.logprobs is set)


def read_request(body: Any, served: ServedModel) -> TokenRequest:
    """A request body -> `TokenRequest`; a one-line ValueError naming the key otherwise."""
    check(isinstance(body, Mapping), "body", type(body).__name__, "must be a JSON object")
    for key, value in body.items():
        check(key in OWN, key, value, f"unknown key; the route takes {', '.join(OWN)}")
    check_model(body.get("model"), served)
    check(not body.get("stream"), "stream", body.get("stream"), "streaming is not supported; leave it out or false")
    for key in ("features", "kv_transfer_params"):
        check(body.get(key) is None, key, body.get(key), "not supported by this server (text prompts only); leave it out")
    request_id = body.get("request_id")
    check(request_id is None or isinstance(request_id, str), "request_id", request_id, "must be a string")
    priority = body.get("priority", 0)
    check(is_int(priority), "priority", priority, "must be an int (lower first)")
    prompt = check_prompt(body.get("token_ids"), "token_ids", served.limits)
    values = body.get("sampling_params") or {}
    check(isinstance(values, Mapping), "sampling_params", values, "must be a JSON object")
    check_known(values, "sampling_params.")
    sampling = read_sampling(values, "sampling_params.", prompt_len=len(prompt), context=served.limits.context,
                             stop_token_ids=served.stop_token_ids)
    check_fits(sampling, len(prompt), "sampling_params.", served.limits)
    logprobs = values.get("logprobs")
    check(logprobs is None or (is_int(logprobs) and logprobs >= 0), "sampling_params.logprobs", logprobs,
          "must be null or an int >= 0 (the sampled token's log-prob is returned either way it is set)")
    return TokenRequest(request_id, prompt, sampling, float(priority), logprobs is not None)


def response(request: TokenRequest, request_id: str, samples: list[SampleOutput]) -> dict[str, Any]:
    """vLLM's `GenerateResponse` for the request's samples (in sample order), plus each token's
    weight version."""
    return {
        "request_id": request.request_id or request_id,
        "choices": [{
            "index": i,
            "token_ids": s.token_ids,
            "logprobs": {"content": [{"token": f"token_id:{t}", "logprob": lp, "bytes": None, "top_logprobs": []}
                                     for t, lp in zip(s.token_ids, s.logprobs)]} if request.logprobs else None,
            "finish_reason": s.finish_reason,
            "token_versions": decode_runs(s.versions),
        } for i, s in enumerate(samples)],
        "prompt_logprobs": None,
        "kv_transfer_params": None,
    }
