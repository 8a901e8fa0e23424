"""The OpenAI-compatible chat route, `POST /v1/chat/completions` (non-streaming), for evaluation
harnesses and anything that speaks the OpenAI SDK.

The messages are rendered with the model's own chat template (jaxrl_async/tokenizer.py, as the
training tasks render prompts) and generated as a token request; the reply's `content` is the
completion decoded with special tokens skipped (so a closing `<|im_end|>` does not show). Each
choice also carries, as vLLM does with `return_token_ids`, its `token_ids`, and (this server's
addition) `token_versions`: the weight version that sampled each token. `logprobs: true` returns
each token's behaviour log-prob (temperature 1, before top-p/top-k; engines/base.py); the
`top_logprobs` lists stay empty, since the engines compute the sampled token's log-prob only.

Taken: model, messages, max_tokens / max_completion_tokens, temperature, top_p, n, seed,
logprobs, top_logprobs, and vLLM's extras (top_k, stop_token_ids, ignore_eos, ...; sampling.py);
`user`, `metadata`, `store` are accepted and ignored. Left out on purpose: streaming, tools,
response formats (refused with a one-line 400 that names the key).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import jinja2

from jaxrl_async.engines.base import SampleOutput, SamplingParams
from jaxrl_async.serving.sampling import (ServedModel, check_fits, check_known, check_model, is_int,
                                          read_sampling)
from planner.configs import check
from planner.versions import decode_runs

OWN = ("model", "messages", "top_logprobs", "stream", "stream_options", "user",
       "metadata", "store", "priority", "request_id")


@dataclass(frozen=True)
class ChatRequest:
    """A checked chat request, its messages rendered to prompt token ids."""

    request_id: str | None
    prompt_ids: list[int]
    sampling: SamplingParams
    priority: float
    logprobs: bool
    skip_special_tokens: bool  # how the reply's content is decoded


def read_request(body: Any, served: ServedModel) -> ChatRequest:
    """A request body -> `ChatRequest`; a one-line ValueError naming the key otherwise."""
    check(isinstance(body, Mapping), "body", type(body).__name__, "must be a JSON object")
    values = dict(body)
    newer = values.pop("max_completion_tokens", None)  # OpenAI's newer name; vLLM reads either
    if values.get("max_tokens") is None and newer is not None:
        values["max_tokens"] = newer
    logprobs = values.pop("logprobs", None)
    check(logprobs is None or isinstance(logprobs, bool), "logprobs", logprobs, "must be true or false")
    check_known(values, "", OWN)
    check_model(values.get("model"), served)
    check(not values.get("stream"), "stream", values.get("stream"), "streaming is not supported; leave it out or false")
    top = values.get("top_logprobs")
    check(top is None or (is_int(top) and top >= 0), "top_logprobs", top, "must be an int >= 0")
    priority = values.get("priority", 0)
    check(is_int(priority), "priority", priority, "must be an int (lower first)")
    request_id = values.get("request_id")
    check(request_id is None or isinstance(request_id, str), "request_id", request_id, "must be a string")
    prompt = render(values.get("messages"), served)
    sampling_values = {k: v for k, v in values.items() if k not in OWN}
    sampling = read_sampling(sampling_values, "", prompt_len=len(prompt), context=served.limits.context,
                             stop_token_ids=served.stop_token_ids)
    check_fits(sampling, len(prompt), "", served.limits)
    skip = values.get("skip_special_tokens", True)
    check(isinstance(skip, bool), "skip_special_tokens", skip, "must be true or false")
    return ChatRequest(request_id, prompt, sampling, float(priority), bool(logprobs), skip)


def render(messages: Any, served: ServedModel) -> list[int]:
    """The prompt token ids of `messages` through the model's chat template (generation prompt
    added); text content only."""
    check(isinstance(messages, list) and messages, "messages", messages, "must be a non-empty list of messages")
    plain = []
    for i, message in enumerate(messages):
        check(isinstance(message, Mapping) and isinstance(message.get("role"), str), f"messages[{i}]", message,
              "must be an object with a string role")
        plain.append({**message, "content": text_of(message.get("content"), f"messages[{i}].content")})
    tok = served.tokenizer
    check(tok.chat_template is not None, "messages", f"[{len(messages)} messages]",
          "the model's tokenizer has no chat template; send token ids to /inference/v1/generate instead")
    try:
        text = tok.apply_chat_template(plain)
    except jinja2.TemplateError as e:  # a template that cannot render these messages
        raise ValueError(f"messages: the chat template failed: {e}") from None
    prompt = tok.encode(text, add_bos=False)  # the template writes its own special tokens
    limits = served.limits
    check(len(prompt) < limits.context, "messages", f"[{len(messages)} messages]",
          f"render to {len(prompt)} tokens, which leave no room in the context {limits.context_key}={limits.context}")
    return prompt


def text_of(content: Any, key: str) -> str:
    """A message's content as text: a string, null, or a list of text parts."""
    if content is None or isinstance(content, str):
        return content or ""
    check(isinstance(content, list), key, content, "must be a string or a list of text parts")
    for j, part in enumerate(content):
        check(isinstance(part, Mapping) and part.get("type") == "text" and isinstance(part.get("text"), str),
              f"{key}[{j}]", part, 'only text parts ({"type": "text", "text": ...}) are supported')
    return "".join(part["text"] for part in content)


def response(request: ChatRequest, request_id: str, samples: list[SampleOutput], served: ServedModel) -> dict[str, Any]:
    """OpenAI's `chat.completion` object for the request's samples (in sample order)."""
    tok = served.tokenizer
    completion = sum(len(s.token_ids) for s in samples)
    return {
        "id": f"chatcmpl-{request.request_id or request_id}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": served.name,
        "choices": [{
            "index": i,
            "message": {"role": "assistant",
                        "content": tok.decode(s.token_ids, skip_special_tokens=request.skip_special_tokens)},
            "logprobs": {"content": [token_logprob(tok.decode([t], skip_special_tokens=False), lp)
                                     for t, lp in zip(s.token_ids, s.logprobs)]} if request.logprobs else None,
            "finish_reason": s.finish_reason,
            "token_ids": s.token_ids,
            "token_versions": decode_runs(s.versions),
        } for i, s in enumerate(samples)],
        "usage": {"prompt_tokens": len(request.prompt_ids), "completion_tokens": completion,
                  "total_tokens": len(request.prompt_ids) + completion},
        "prompt_token_ids": request.prompt_ids,
    }


def token_logprob(text: str, logprob: float) -> dict[str, Any]:
    return {"token": text, "logprob": logprob, "bytes": list(text.encode()), "top_logprobs": []}
