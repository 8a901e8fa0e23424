"""verifiers' own `TrainClient` (0.4.x: renders the chat with the model's tokenizer, then calls
`/inference/v1/generate` through `renderers.client.generate`) talks to the server and trains on
exactly the tokens and log-probs the engine sampled."""

from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest

pytest.importorskip("fastapi", reason="the server needs the serve extra: pip install -e '.[serve]'")
pytest.importorskip("uvicorn", reason="the server needs the serve extra: pip install -e '.[serve]'")
pytest.importorskip("verifiers", reason="verifiers (the environments extra) is not installed")
pytest.importorskip("transformers", reason="verifiers' renderer loads the tokenizer with transformers")
from renderers import DefaultRendererConfig  # noqa: E402
from verifiers.v1.clients.train import TrainClient  # noqa: E402
from verifiers.v1.configs.client import TrainClientConfig  # noqa: E402
from verifiers.v1.dialects.chat import ChatDialect  # noqa: E402
from verifiers.v1.types import SamplingConfig  # noqa: E402

from jaxrl_async.engines.base import SamplingParams  # noqa: E402
from tests.helpers.serving import run_directly, running_server, tiny  # noqa: E402

LOADED = tiny()


def hf_tokenizer_dir(path) -> str:
    """The tiny model's tokenizer as a HF directory, which is what verifiers' renderer loads."""
    tok = LOADED.tokenizer
    tok.backend.save(str(path / "tokenizer.json"))
    name = tok.backend.id_to_token
    (path / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "chat_template": tok.chat_template,
        "bos_token": name(tok.bos_token_id), "eos_token": name(tok.eos_token_ids[1]),
        "pad_token": name(tok.pad_token_id)}))
    return str(path)


def test_verifiers_train_client_gets_the_engines_tokens_and_logprobs(tmp_path, monkeypatch):
    monkeypatch.setenv("JAXRL_SERVE_KEY", "unused")
    messages = [{"role": "user", "content": "hello"}]
    with running_server(LOADED) as running:
        client = TrainClient(TrainClientConfig(base_url=running.url + "/v1", api_key_var="JAXRL_SERVE_KEY",
                                               renderer=DefaultRendererConfig(),
                                               renderer_model_name=hf_tokenizer_dir(tmp_path)))

        async def ask():
            try:
                return await client.get_response(ChatDialect(), {"model": "tiny", "messages": messages},
                                                 SamplingConfig(temperature=1.0, max_tokens=10, seed=11))
            finally:
                await client.close()

        response = asyncio.run(ask())
    tokens = response.tokens
    tok = LOADED.tokenizer
    assert tokens.prompt_ids == tok.encode(tok.apply_chat_template(messages), add_bos=False)
    (want,) = run_directly(LOADED, tokens.prompt_ids, SamplingParams(
        max_new_tokens=10, temperature=1.0, seed=11, stop_token_ids=LOADED.stop_token_ids))
    assert tokens.completion_ids == want.token_ids and len(want.token_ids) > 0
    np.testing.assert_allclose(tokens.completion_logprobs, want.logprobs, atol=1e-6)
    assert response.finish_reason == want.finish_reason
