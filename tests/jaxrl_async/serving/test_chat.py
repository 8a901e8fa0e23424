"""jaxrl_async/serving/chat.py: OpenAI chat requests rendered with the model's chat template."""

import dataclasses

import pytest

from jaxrl_async.engines.base import SampleOutput
from jaxrl_async.serving.chat import read_request, response
from tests.jaxrl_async.serving.test_tokens import SERVED


def test_messages_render_through_the_template_and_max_completion_tokens_is_max_tokens():
    body = {"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 4, "temperature": 0,
            "logprobs": True, "top_logprobs": 0, "user": "someone"}
    got = read_request(body, SERVED)
    tok = SERVED.tokenizer
    assert got.prompt_ids == tok.encode(tok.apply_chat_template([{"role": "user", "content": "hi"}]), add_bos=False)
    assert got.sampling.max_new_tokens == 4 and got.sampling.temperature == 0.0 and got.logprobs


def test_the_reply_is_the_decoded_completion_without_special_tokens_and_carries_ids_and_versions():
    request = read_request({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}, SERVED)
    sample = SampleOutput("serve-0", 0, [104, 105, 257], [-1.0, -1.0, -1.0], [[0, 3]], "stop", True)
    (choice,) = response(request, "serve-0", [sample], SERVED)["choices"]
    assert choice["message"]["content"] == "hi" and choice["token_ids"] == [104, 105, 257]
    assert choice["token_versions"] == [0, 0, 0] and choice["logprobs"] is None


def test_a_tokenizer_without_a_chat_template_points_to_the_token_route():
    served = dataclasses.replace(SERVED, tokenizer=dataclasses.replace(SERVED.tokenizer, chat_template=None))
    with pytest.raises(ValueError, match="has no chat template; send token ids to /inference/v1/generate"):
        read_request({"messages": [{"role": "user", "content": "hi"}]}, served)
