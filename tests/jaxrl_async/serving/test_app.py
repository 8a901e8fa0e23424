"""The HTTP server (jaxrl_async/serving/app.py) under uvicorn on a loopback port: what comes back
over the wire is what the engine produces, bad requests are one-line 400s naming the key, and a
client that goes away aborts its request."""

from __future__ import annotations

import json
import socket
import time

import numpy as np
import pytest

pytest.importorskip("fastapi", reason="the server needs the serve extra: pip install -e '.[serve]'")
pytest.importorskip("uvicorn", reason="the server needs the serve extra: pip install -e '.[serve]'")
import httpx  # noqa: E402  (a dependency of fastapi's test stack and of openai)

from jaxrl_async.engines.base import SamplingParams  # noqa: E402
from jaxrl_async.engines.jax.engine import JaxEngine  # noqa: E402
from tests.helpers.serving import ENGINE, DyingEngine, HoldingEngine, run_directly, running_server, tiny  # noqa: E402

LOADED = tiny()


@pytest.fixture(scope="module")
def server():
    with running_server(LOADED) as running:
        yield running


def post(server, route: str, body) -> httpx.Response:
    return httpx.post(server.url + route, content=json.dumps(body), timeout=120)


def test_the_generate_route_returns_the_engines_own_tokens_logprobs_and_versions(server):
    prompt = [5, 17, 99, 3, 42]
    body = {"model": "tiny", "token_ids": prompt, "request_id": "mine",
            "sampling_params": {"max_tokens": 12, "temperature": 0.9, "top_k": -1, "top_p": 0.95, "seed": 7, "n": 2,
                                "logprobs": 1, "stop_token_ids": [13], "skip_special_tokens": False}}
    reply = post(server, "/inference/v1/generate", body)
    assert reply.status_code == 200, reply.text
    got = reply.json()
    assert got["request_id"] == "mine" and [c["index"] for c in got["choices"]] == [0, 1]
    sampling = SamplingParams(max_new_tokens=12, temperature=0.9, top_p=0.95, seed=7, n=2,
                              stop_token_ids=(13, *LOADED.stop_token_ids))
    for choice, want in zip(got["choices"], run_directly(LOADED, prompt, sampling)):
        assert choice["token_ids"] == want.token_ids and choice["finish_reason"] == want.finish_reason
        content = choice["logprobs"]["content"]
        assert [c["token"] for c in content] == [f"token_id:{t}" for t in want.token_ids]
        np.testing.assert_allclose([c["logprob"] for c in content], want.logprobs, rtol=0, atol=1e-6)
        assert choice["token_versions"] == [0] * len(want.token_ids)
    assert got["choices"][0]["token_ids"] != got["choices"][1]["token_ids"]  # two samples, not one twice


def test_logprobs_come_back_only_when_asked_for_as_vllm_does(server):
    reply = post(server, "/inference/v1/generate", {"token_ids": [1, 2], "sampling_params": {"max_tokens": 3}})
    assert reply.status_code == 200 and reply.json()["choices"][0]["logprobs"] is None


def test_the_chat_route_renders_the_template_and_returns_the_decoded_tokens(server):
    messages = [{"role": "system", "content": "be brief"},
                {"role": "user", "content": [{"type": "text", "text": "2+2"}, {"type": "text", "text": "?"}]}]
    body = {"model": "tiny", "messages": messages, "max_completion_tokens": 9, "temperature": 0, "logprobs": True}
    reply = post(server, "/v1/chat/completions", body)
    assert reply.status_code == 200, reply.text
    got = reply.json()
    tok = LOADED.tokenizer
    prompt = tok.encode(tok.apply_chat_template([messages[0], {"role": "user", "content": "2+2?"}]), add_bos=False)
    (choice,) = got["choices"]
    (want,) = run_directly(LOADED, prompt, SamplingParams(max_new_tokens=9, temperature=0.0,
                                                          stop_token_ids=LOADED.stop_token_ids))
    assert got["prompt_token_ids"] == prompt and choice["token_ids"] == want.token_ids
    assert choice["message"] == {"role": "assistant", "content": tok.decode(want.token_ids)}
    np.testing.assert_allclose([c["logprob"] for c in choice["logprobs"]["content"]], want.logprobs, atol=1e-6)
    assert got["usage"] == {"prompt_tokens": len(prompt), "completion_tokens": len(want.token_ids),
                            "total_tokens": len(prompt) + len(want.token_ids)}
    assert got["object"] == "chat.completion" and got["model"] == "tiny"


@pytest.mark.parametrize(("route", "body", "message"), [
    ("/inference/v1/generate", {"token_ids": [], "sampling_params": {}},
     "token_ids=[]: must be a non-empty list of token ids"),
    ("/inference/v1/generate", {"token_ids": [1, 2], "sampling_params": {"max_tokens": 63}},
     "sampling_params.max_tokens=63: a prompt of 2 tokens + max_tokens = 65 exceeds the context engine.max_len=64"),
    ("/inference/v1/generate", {"token_ids": [1] * 64}, "token_ids=[1, 1, 1, 1, 1, 1, 1, 1, '...']: a prompt of 64 "
     "tokens leaves no room in the context engine.max_len=64"),
    ("/inference/v1/generate", {"token_ids": [1], "sampling_params": {"top_p": 1.5}},
     "sampling_params.top_p=1.5: must be a number in (0, 1]"),
    ("/inference/v1/generate", {"token_ids": [1], "sampling_params": {"temperature": -1}},
     "sampling_params.temperature=-1: must be a number >= 0 (0 = greedy)"),
    ("/inference/v1/generate", {"token_ids": [1], "sampling_params": {"n": 5}},
     "sampling_params.n=5: exceeds engine.num_slots=4 (a request's samples decode together)"),
    ("/inference/v1/generate", {"token_ids": [1], "sampling_params": {"repetition_penalty": 1.2}},
     "sampling_params.repetition_penalty=1.2: not supported by this server"),
    ("/inference/v1/generate", {"token_ids": [1], "sampling_params": {"best_of": 2}},
     "sampling_params.best_of=2: unknown key for this server"),
    ("/inference/v1/generate", {"token_ids": [1, 99999]}, "token id 99999 is outside the vocabulary"),
    ("/inference/v1/generate", {"token_ids": [1], "stream": True}, "stream=True: streaming is not supported"),
    ("/v1/chat/completions", {"messages": []}, "messages=[]: must be a non-empty list of messages"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 0},
     "max_tokens=0: must be an int >= 1"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "seed": -3},
     "seed=-3: must be null or an int in [0, 2**32)"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
     "messages[0].content[0]={'type': 'image_url'}: only text parts"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "tools": [{}]},
     "tools=[{}]: unknown key for this server"),
])
def test_a_bad_request_is_a_400_whose_one_line_message_names_the_key(server, route, body, message):
    reply = post(server, route, body)
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert message in error["message"] and "\n" not in error["message"] and error["code"] == 400


def test_another_model_is_a_404_and_bad_json_a_400(server):
    reply = post(server, "/inference/v1/generate", {"model": "gpt-9", "token_ids": [1]})
    assert reply.status_code == 404 and "model='gpt-9': this server serves 'tiny' only" in reply.json()["error"]["message"]
    reply = httpx.post(server.url + "/v1/chat/completions", content=b"{not json", timeout=30)
    assert reply.status_code == 400 and reply.json()["error"]["message"].startswith("body: not valid JSON")


def test_models_lists_the_served_model_with_its_context_and_health_counts_requests(server):
    models = httpx.get(server.url + "/v1/models", timeout=30).json()
    assert [(m["id"], m["max_model_len"]) for m in models["data"]] == [("tiny", ENGINE.max_len)]
    health = httpx.get(server.url + "/health", timeout=30)
    assert health.status_code == 200 and health.json()["status"] == "ok"
    assert health.json()["finished"] == server.client.counts["finished"] >= 1


def test_a_client_that_disconnects_aborts_its_request_in_the_engine():
    engine = HoldingEngine(JaxEngine(LOADED.model, LOADED.cfg, ENGINE))
    with running_server(LOADED, engine) as running:
        host, port = running.url.removeprefix("http://").split(":")
        body = json.dumps({"token_ids": [1, 2, 3], "sampling_params": {"max_tokens": 8}}).encode()
        with socket.create_connection((host, int(port)), timeout=10) as conn:
            conn.sendall(b"POST /inference/v1/generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
            deadline = time.monotonic() + 30
            while running.client.counts["submitted"] < 1:  # the request is in the engine
                assert time.monotonic() < deadline
                time.sleep(0.01)
        deadline = time.monotonic() + 30
        while not engine.aborted:
            assert time.monotonic() < deadline, "the engine was never asked to abort"
            time.sleep(0.01)
        assert engine.aborted == ["serve-0"] and running.client.counts["aborted"] == 1
        assert running.client.in_flight == 0


def test_a_dead_engine_is_a_503_on_the_request_and_on_health():
    with running_server(LOADED, DyingEngine(JaxEngine(LOADED.model, LOADED.cfg, ENGINE))) as running:
        reply = post(running, "/inference/v1/generate", {"token_ids": [1, 2], "sampling_params": {"max_tokens": 3}})
        assert reply.status_code == 503 and reply.json()["error"]["message"] == "the engine died: device lost"
        health = httpx.get(running.url + "/health", timeout=30)
        assert health.status_code == 503 and "device lost" in health.json()["error"]["message"]
