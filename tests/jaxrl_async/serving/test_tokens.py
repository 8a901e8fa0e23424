"""jaxrl_async/serving/tokens.py: the request and response of vLLM's /inference/v1/generate, as
renderers.client.generate (verifiers' TrainClient) sends and reads them."""

import pytest

from jaxrl_async.engines.base import RequestLimits, SampleOutput
from jaxrl_async.serving.sampling import ModelNotFound, ServedModel
from jaxrl_async.serving.tokens import read_request, response
from jaxrl_async.tokenizer import tiny_tokenizer

SERVED = ServedModel("tiny", "tiny", tiny_tokenizer(), (257,), RequestLimits(64, "engine.max_len", 4,
                                                                             "engine.num_slots", 300))


def test_the_renderers_clients_body_reads_as_the_engine_request_it_means():
    # renderers.client.generate: model, token_ids, sampling_params with stop_token_ids, logprobs=1
    # and skip_special_tokens=False set by the client, the rest from verifiers' SamplingConfig.
    body = {"model": "tiny", "token_ids": [1, 2, 3], "priority": 2,
            "sampling_params": {"temperature": 0.5, "top_p": 0.9, "max_tokens": 7, "stop_token_ids": [260],
                                "logprobs": 1, "skip_special_tokens": False}}
    got = read_request(body, SERVED)
    assert got.prompt_ids == [1, 2, 3] and got.logprobs and got.priority == 2.0 and got.request_id is None
    assert (got.sampling.temperature, got.sampling.top_p, got.sampling.max_new_tokens) == (0.5, 0.9, 7)
    assert got.sampling.stop_token_ids == (260, 257)
    # a later turn of a multi-turn episode (TrainClient bridges the prompt) adds this key
    bridged = {**body, "sampling_params": {**body["sampling_params"], "routed_experts_prompt_start": 11}}
    assert read_request(bridged, SERVED) == got


def test_the_response_is_vllms_with_each_tokens_version():
    request = read_request({"token_ids": [1], "sampling_params": {"max_tokens": 3, "logprobs": 0}}, SERVED)
    sample = SampleOutput("serve-4", 0, [65, 66, 257], [-1.0, -2.0, -0.5], [[3, 2], [4, 1]], "stop", True)
    got = response(request, "serve-4", [sample])
    (choice,) = got["choices"]
    assert got["request_id"] == "serve-4" and choice["token_ids"] == [65, 66, 257]
    assert choice["logprobs"]["content"][2] == {"token": "token_id:257", "logprob": -0.5, "bytes": None,
                                                "top_logprobs": []}
    assert choice["token_versions"] == [3, 3, 4] and choice["finish_reason"] == "stop"


@pytest.mark.parametrize(("body", "error", "message"), [
    ([1, 2], ValueError, "body='list': must be a JSON object"),
    ({"token_ids": [1], "prompt": "hi"}, ValueError, "prompt='hi': unknown key"),
    ({"token_ids": [1], "model": "other"}, ModelNotFound, "model='other'"),
    ({"token_ids": [1], "features": {"x": 1}}, ValueError, "features={'x': 1}: not supported"),
    ({"token_ids": [1], "priority": 0.5}, ValueError, "priority=0.5: must be an int"),
    ({"token_ids": [1], "sampling_params": {"logprobs": -1}}, ValueError, "sampling_params.logprobs=-1"),
])
def test_a_bad_body_is_one_line_naming_the_key(body, error, message):
    with pytest.raises(error, match="^" + __import__("re").escape(message)):
        read_request(body, SERVED)
