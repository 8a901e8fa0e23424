"""Speculative decoding in the JAX engine (speculative.py) against plain sampling, on a tiny model.

The statistical tests compare, with and without speculation, the joint distribution of the
first two sampled tokens and the third token's of N = 4,096 samples each (independent seeds) by a
two-sample chi-square test at alpha = 0.001 each; categories with fewer than POOL = 40 samples in
both arms together are pooled into one, which leaves 20-60 degrees of freedom here.
Power: moving a total-variation mass of 0.05 between two categories of at most 0.15 each gives
the noncentrality N * sum (p_i - q_i)^2 / (p_i + q_i) >= 4096 * 2 * 0.05^2 / 0.3 = 68, so the test
detects it with probability >= 0.93 at alpha = 0.001 and 60 degrees of freedom (the noncentral
chi-square);
`test_the_statistic_detects_a_wrong_acceptance_rule` shows that a real fault lies far beyond.
Greedy decoding is checked token for token instead.
"""

import collections

import jax
import numpy as np
import pytest
from flax import nnx
from jax.scipy.stats import chi2

from jaxrl_async.engines.base import GenerationRequest, SamplingParams
from jaxrl_async.engines.jax import speculative
from jaxrl_async.engines.jax.config import EngineConfig
from jaxrl_async.engines.jax.core import EngineCore
from jaxrl_async.engines.speculation import SpeculationConfig
from jaxrl_async.models.config import ModelConfig
from jaxrl_async.models.transformer import Transformer
from tests.jaxrl_async.engines.jax.test_core import forward_logits, greedy_reference, peaked_model, run

CFG = ModelConfig.tiny()
BASE = [5, 6, 7, 8, 9]
# The n-gram draft of this prompt's first token is 144, which the spread model gives ~0.17: so
# drafts are accepted and rejected often (checked in the tests).
PROMPT = BASE + [144] + BASE
N_REQUESTS, SLOTS = 64, 64  # N = 4,096 samples per arm
POOL = 40  # categories with fewer samples in both arms together are pooled into one
NGRAM = SpeculationConfig(when="always", tokens=4, max_active=64)
SELF_DRAFT = SpeculationConfig(when="always", method="draft", draft_model="layers:1", tokens=3, max_active=64)


@pytest.fixture(scope="module")
def spread():
    """A tiny random model whose next-token distributions put 0.1-0.3 on a few tokens."""
    model = Transformer(CFG, rngs=nnx.Rngs(0))
    model.lm_head.value = model.lm_head.value * 16
    return model


@pytest.fixture(scope="module")
def peaked():
    return peaked_model()


def make_core(model, spec: SpeculationConfig = SpeculationConfig(), **overrides) -> EngineCore:
    config = dict(num_slots=4, max_len=64, min_bucket=8, decode_steps_per_call=4, speculation=spec)
    config.update(overrides)
    return EngineCore(model, model.cfg, EngineConfig(**config))


def sample_many(model, spec: SpeculationConfig, temperature: float, top_p: float) -> tuple[np.ndarray, dict]:
    """[N, 3] first three tokens of N samples of PROMPT, and the core's counters.

    Each arm has its own seeds: an undrafted or rejected speculative row reuses plain sampling's
    uniform, so the same seeds would correlate the arms (and make the test conservative)."""
    first_seed = 1000 if not spec.enabled else 100_000
    core = make_core(model, spec, num_slots=SLOTS, max_len=32, min_bucket=16)
    for r in range(N_REQUESTS):
        core.submit(GenerationRequest(f"r{r}", PROMPT, SamplingParams(3, temperature=temperature, top_p=top_p,
                                                                      n=SLOTS, seed=first_seed + r)))
    out = run(core)
    return np.array([o.token_ids for o in out.values()]), dict(core.counters)


def chi_square_p(a: list, b: list) -> float:
    """Two-sample chi-square p-value of two lists of hashable outcomes (rare ones pooled)."""
    ca, cb = collections.Counter(a), collections.Counter(b)
    keys = [k for k in set(ca) | set(cb) if ca[k] + cb[k] >= POOL]
    rest_a, rest_b = len(a) - sum(ca[k] for k in keys), len(b) - sum(cb[k] for k in keys)
    table = np.array([[ca[k] for k in keys] + [rest_a], [cb[k] for k in keys] + [rest_b]])
    table = table[:, table.sum(0) > 0].astype(np.float64)
    expected = table.sum(1, keepdims=True) * table.sum(0, keepdims=True) / table.sum()
    statistic = float(((table - expected) ** 2 / expected).sum())
    return float(chi2.sf(statistic, table.shape[1] - 1))  # the test of homogeneity, (2-1)(C-1) dof


def same_distribution(plain: np.ndarray, spec: np.ndarray) -> tuple[float, float]:
    """(p-value of the first two tokens' joint, p-value of the third token)."""
    return (chi_square_p([tuple(r[:2]) for r in plain], [tuple(r[:2]) for r in spec]),
            chi_square_p(list(plain[:, 2]), list(spec[:, 2])))


@pytest.mark.parametrize("top_p", [1.0, 0.8])
@pytest.mark.parametrize("temperature", [0.7, 1.0, 1.3])
def test_ngram_speculation_samples_the_same_distribution_as_plain_sampling(spread, temperature, top_p):
    plain, _ = sample_many(spread, SpeculationConfig(), temperature, top_p)
    spec, counters = sample_many(spread, NGRAM, temperature, top_p)
    assert 0 < counters["accepted"] < counters["drafted"]  # both branches of the rule ran
    assert min(same_distribution(plain, spec)) > 1e-3


@pytest.mark.parametrize("temperature", [0.7, 1.3])
def test_self_draft_speculation_samples_the_same_distribution_as_plain_sampling(spread, temperature):
    plain, _ = sample_many(spread, SpeculationConfig(), temperature, 0.8)
    spec, counters = sample_many(spread, SELF_DRAFT, temperature, 0.8)
    assert 0 < counters["accepted"] < counters["drafted"]
    assert min(same_distribution(plain, spec)) > 1e-3


def test_the_statistic_detects_a_wrong_acceptance_rule(spread, monkeypatch):
    """Always accepting the draft (the rule minus its test) is caught by the same statistic."""
    plain, _ = sample_many(spread, SpeculationConfig(), 1.0, 1.0)
    monkeypatch.setattr(speculative, "accepts", lambda u, p_x, q_x: p_x >= 0)
    jax.clear_caches()  # the patched rule must be traced
    try:
        wrong, _ = sample_many(spread, NGRAM, 1.0, 1.0)
    finally:
        monkeypatch.undo()
        jax.clear_caches()
    assert min(same_distribution(plain, wrong)) < 1e-3


REPEATING = [5, 6, 7, 8, 5, 6, 7, 8, 5, 6, 7]


def greedy(max_new_tokens: int, **kw) -> SamplingParams:
    return SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0, **kw)


@pytest.mark.parametrize("spec", [NGRAM, SELF_DRAFT], ids=["ngram", "layers:1"])
def test_greedy_speculation_emits_plain_greedy_decoding_token_for_token(peaked, spec):
    core = make_core(peaked, spec)
    core.submit(GenerationRequest("a", REPEATING, greedy(24)))
    core.submit(GenerationRequest("b", [3, 1, 4, 1, 5], greedy(16, n=2)))
    out = run(core)
    assert 0 < core.counters["accepted"] < core.counters["drafted"]  # non-trivial: both outcomes
    assert core.counters["decode_steps"] < 24  # the accepted drafts saved verify passes
    assert out[("a", 0)].token_ids == greedy_reference(peaked, REPEATING, 24)
    for i in range(2):
        assert out[("b", i)].token_ids == greedy_reference(peaked, [3, 1, 4, 1, 5], 16)


@pytest.mark.parametrize("spec", [NGRAM, SELF_DRAFT], ids=["ngram", "layers:1"])
def test_logprobs_after_rejections_equal_a_teacher_forced_forward_pass(spread, spec):
    core = make_core(spread, spec)
    core.submit(GenerationRequest("a", PROMPT, SamplingParams(40, temperature=0.7, top_p=0.9, seed=3, n=2)))
    core.submit(GenerationRequest("b", REPEATING, SamplingParams(40, temperature=1.0, seed=4)))
    out = run(core)
    assert 0 < core.counters["accepted"] < core.counters["drafted"]  # rejections happened
    for (rid, _), sample in out.items():
        p = PROMPT if rid == "a" else REPEATING
        logp = jax.nn.log_softmax(forward_logits(spread, p + sample.token_ids), axis=-1)
        want = [float(logp[len(p) - 1 + t, tok]) for t, tok in enumerate(sample.token_ids)]
        np.testing.assert_allclose(sample.logprobs, want, atol=1e-5, rtol=0)
        assert sample.versions == [[0, 40]]


def test_the_kv_cache_after_rejections_equals_plain_decodings_on_every_valid_position(peaked):
    spec_core, plain_core = make_core(peaked, NGRAM, num_slots=1), make_core(peaked, num_slots=1)
    for core in (spec_core, plain_core):
        core.submit(GenerationRequest("a", REPEATING, greedy(20)))
        run(core)
    assert 0 < spec_core.counters["accepted"] < spec_core.counters["drafted"]
    valid = len(REPEATING) - 1 + 20  # prompt and every fed token (the last token is never fed)
    for got, want in zip(spec_core.cache.k + spec_core.cache.v, plain_core.cache.k + plain_core.cache.v):
        got, want = np.asarray(got)[0], np.asarray(want)[0]
        axis = got.ndim - 1 if got.shape[-1] == spec_core.config.max_len else got.ndim - 2
        np.testing.assert_allclose(np.take(got, range(valid), axis), np.take(want, range(valid), axis),
                                   atol=1e-5, rtol=0)


def test_critical_mode_drafts_only_for_marked_requests_and_unknown_ids_are_ignored(peaked):
    core = make_core(peaked, SpeculationConfig(when="critical", method="draft", draft_model="layers:1", tokens=4),
                     decode_steps_per_call=1)  # one verify pass a call
    core.submit(GenerationRequest("a", REPEATING, greedy(24)))
    core.submit(GenerationRequest("b", REPEATING, greedy(24)))
    run(core, steps=2)
    assert core.counters["drafted"] == 0  # nobody marked: plain decode calls
    core.mark_critical("b")
    core.mark_critical("unknown")
    core.step()
    drafted = core.counters["drafted"]
    assert drafted == 4  # b's one slot drafted (the self-draft always drafts k), a's did not
    out = run(core)
    assert out[("a", 0)].token_ids == out[("b", 0)].token_ids == greedy_reference(peaked, REPEATING, 24)
    assert not core.requests.critical  # forgotten with the finished request


def test_no_drafting_while_more_slots_than_max_active_are_active(peaked):
    core = make_core(peaked, SpeculationConfig(when="always", method="draft", draft_model="layers:1", max_active=1))
    core.submit(GenerationRequest("long", REPEATING, greedy(30)))
    core.submit(GenerationRequest("short", REPEATING, greedy(6)))  # 4 plain steps a call: 2 calls
    core.step()
    assert core.active_slots == 2 and core.counters["drafted"] == 0
    out = run(core)
    assert core.counters["drafted"] > 0  # alone again: the weight-bound regime
    assert out[("long", 0)].token_ids == greedy_reference(peaked, REPEATING, 30)


def test_a_weight_swap_mid_speculation_tags_each_token_with_the_weights_that_verified_it(peaked):
    other = peaked_model(seed=1)
    new_params = nnx.split(other, nnx.Param, ...)[1]
    core = make_core(peaked, NGRAM)
    core.submit(GenerationRequest("a", REPEATING, greedy(24)))
    run(core, steps=3)
    before = core.slots.seqs[0].generated
    core.update_weights(new_params, version=1)
    (out,) = run(core).values()
    assert 0 < before < 24 and out.versions == [[0, before], [1, 24 - before]]
    # The same swap after `before` plain one-token steps gives the same tokens.
    plain = make_core(peaked, decode_steps_per_call=1)
    plain.submit(GenerationRequest("a", REPEATING, greedy(24)))
    run(plain, steps=before)
    plain.update_weights(new_params, version=1)
    (want,) = run(plain).values()
    assert out.token_ids == want.token_ids and out.versions == want.versions


def test_abort_and_priorities_are_honoured_while_speculating(peaked):
    core = make_core(peaked, NGRAM, num_slots=1)
    core.submit(GenerationRequest("first", REPEATING, greedy(30)))
    core.step()
    core.submit(GenerationRequest("late", [1, 2], greedy(4), priority=5.0))
    core.submit(GenerationRequest("urgent", [3, 4], greedy(4), priority=1.0))
    core.step()
    (aborted,) = core.abort("first")
    assert aborted.finish_reason == "abort" and aborted.done
    assert 0 < len(aborted.token_ids) < 30
    assert aborted.token_ids == greedy_reference(peaked, REPEATING, len(aborted.token_ids))
    order = []
    while core.has_work():
        order += [o.request_id for o in core.step() if o.done]
    assert order == ["urgent", "late"]


def test_speculation_is_refused_on_the_paged_engine_and_for_a_separate_draft_model(peaked):
    with pytest.raises(ValueError, match=r"^engine\.speculation\.when='always': needs engine\.page_size=0"):
        EngineConfig(page_size=16, max_len=64, speculation=NGRAM)
    spec = SpeculationConfig(when="always", method="draft", draft_model="Qwen/Qwen2.5-0.5B")
    with pytest.raises(ValueError, match=r"^engine\.speculation\.draft_model='Qwen/Qwen2\.5-0\.5B': .*layers:N"):
        make_core(peaked, spec)
    with pytest.raises(ValueError, match=r"^engine\.speculation\.draft_model='layers:2': N must be in \[1, 1\]"):
        make_core(peaked, SpeculationConfig(when="always", method="draft", draft_model="layers:2"))


def test_ngram_draft_is_the_continuation_of_the_latest_earlier_match():
    assert speculative.ngram_draft([1, 2, 3, 9, 1, 2, 4, 5, 1, 2], 2, 3) == [4, 5, 1]
    assert speculative.ngram_draft([1, 2, 3, 1, 2], 2, 5) == [3, 1, 2]
    assert speculative.ngram_draft([7, 7, 7], 2, 4) == [7]  # overlapping the suffix
    assert speculative.ngram_draft([1, 2, 3], 2, 4) == []
    assert speculative.ngram_draft([1], 2, 4) == []


def test_the_device_ngram_draft_equals_the_host_rule_on_random_histories():
    rng = np.random.default_rng(0)
    histories = [list(rng.integers(0, 4, n)) for n in [0, 1, 2, 3, 5, 8, 13, 20, 31, 32] for _ in range(3)]
    table = np.zeros((len(histories), 32), np.int32)
    for row, h in enumerate(histories):
        table[row, :len(h)] = h
    lengths = np.array([len(h) for h in histories], np.int32)
    for ngram, k in [(1, 3), (2, 4), (3, 2)]:
        drafts, count = map(np.asarray, speculative.device_ngram(table, lengths, ngram, k))
        got = [list(drafts[row, :count[row]]) for row in range(len(histories))]
        want = [speculative.ngram_draft(h, ngram, k) for h in histories]
        assert got == want
        assert sum(map(len, want)) > 0
