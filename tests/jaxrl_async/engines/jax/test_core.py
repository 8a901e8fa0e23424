"""EngineCore against uncached full-recompute references, on a tiny random model."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxrl_async.engines.base import GenerationRequest, SamplingParams, join_outputs
from jaxrl_async.engines.jax.compiles import COMPILE_COUNTS
from jaxrl_async.engines.jax.config import EngineConfig
from jaxrl_async.engines.jax.core import EngineCore
from jaxrl_async.models.config import ModelConfig
from jaxrl_async.models.transformer import Transformer
from tests.helpers.engines import params_of

CFG = ModelConfig.tiny()


def peaked_model(seed: int = 0, cfg: ModelConfig = CFG) -> Transformer:
    """A tiny random model whose logits are far from uniform, so argmax ties cannot flip."""
    model = Transformer(cfg, rngs=nnx.Rngs(seed))
    model.lm_head.value = model.lm_head.value * 50
    return model


@pytest.fixture(scope="module")
def model():
    return peaked_model()


@pytest.fixture(scope="module")
def other_model():
    """Different weights of the same structure, to push as an update."""
    return peaked_model(seed=1)


def make_core(model, **overrides) -> EngineCore:
    """Tests share one engine shape (4 slots, 64 positions), hence one set of compilations.
    One decode step per call unless asked: the tests count steps."""
    config = dict(num_slots=4, max_len=64, min_bucket=8, decode_steps_per_call=1)
    config.update(overrides)
    return EngineCore(model, model.cfg, EngineConfig(**config))


def compiles_since(before: dict) -> dict:
    return {k: v - before.get(k, 0) for k, v in COMPILE_COUNTS.items() if v - before.get(k, 0)}


def run(core: EngineCore, steps: int | None = None) -> dict[tuple[str, int], object]:
    """Step until idle (or `steps` times); return each finished sample joined from its pieces."""
    pieces: dict[tuple[str, int], list] = {}
    n = 0
    while core.has_work() and (steps is None or n < steps):
        for out in core.step():
            pieces.setdefault((out.request_id, out.sample_index), []).append(out)
        n += 1
    return {key: join_outputs(p) for key, p in pieces.items()}


@functools.partial(jax.jit, static_argnums=0)
def _uncached_forward(graphdef, state, tokens):
    model = nnx.merge(graphdef, state)
    return model(tokens, jnp.arange(tokens.shape[1], dtype=jnp.int32)[None])


def forward_logits(model, ids: list[int]) -> np.ndarray:
    """Uncached forward over the whole sequence: float32 logits [T, V].

    Right-padded to 64 (causal attention: padding cannot change earlier logits), so that the
    reference compiles once.
    """
    tokens = np.zeros((1, 64), np.int32)
    tokens[0, :len(ids)] = ids
    return np.asarray(_uncached_forward(*nnx.split(model), tokens)[0, :len(ids)])


def greedy_reference(model, prompt: list[int], n_new: int) -> list[int]:
    ids = list(prompt)
    for _ in range(n_new):
        ids.append(int(np.argmax(forward_logits(model, ids)[-1])))
    return ids[len(prompt):]


def greedy(max_new_tokens: int, **kw) -> SamplingParams:
    return SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0, **kw)


def test_greedy_decoding_equals_full_recompute_token_for_token_with_more_requests_than_slots(model):
    core = make_core(model)
    prompts = {"len1": [5], "len8": list(range(10, 18)), "len9": list(range(30, 39)),
               "len3": [7, 1, 200], "len20": list(range(40, 60)), "len2": [3, 4]}
    for rid, prompt in prompts.items():
        core.submit(GenerationRequest(rid, prompt, greedy(12)))
    results = run(core)
    for rid, prompt in prompts.items():
        out = results[(rid, 0)]
        assert out.token_ids == greedy_reference(model, prompt, 12), rid
        assert out.finish_reason == "length" and out.done


def test_n_samples_share_one_prefill_and_each_matches_the_reference(model):
    core = make_core(model)
    prompt = list(range(20, 31))
    core.submit(GenerationRequest("g", prompt, greedy(6, n=3)))
    results = run(core)
    want = greedy_reference(model, prompt, 6)
    assert [results[("g", i)].token_ids for i in range(3)] == [want] * 3
    assert core.counters["prefills"] == 1
    assert core.counters["prefill_tokens"] == len(prompt) - 1


def test_prompts_packed_into_one_prefill_each_with_n_samples_match_the_reference(model):
    core = make_core(model, num_slots=8)
    prompts = {"a": list(range(20, 31)), "b": [7, 1, 200], "c": list(range(40, 57)), "d": [9, 9]}
    for rid, prompt in prompts.items():
        core.submit(GenerationRequest(rid, prompt, greedy(6, n=2)))
    results = run(core)
    assert core.counters["prefill_calls"] == 1 and core.counters["prefills"] == 4
    for rid, prompt in prompts.items():
        want = greedy_reference(model, prompt, 6)
        assert [results[(rid, i)].token_ids for i in range(2)] == [want, want], rid


def test_stop_token_ends_the_sample_and_is_included(model):
    prompt = [9, 8, 7]
    ref = greedy_reference(model, prompt, 8)
    stop = ref[3]
    first = ref.index(stop)
    core = make_core(model)
    core.submit(GenerationRequest("s", prompt, greedy(8, stop_token_ids=(stop,))))
    out = run(core)[("s", 0)]
    assert out.token_ids == ref[:first + 1]
    assert out.finish_reason == "stop"


def test_logprobs_match_a_teacher_forced_forward_pass_at_temperature_one(model):
    core = make_core(model)
    prompt = [1, 2, 3, 4, 5, 6]
    # Sampled with temperature and top-p, yet the reported log-prob is the raw temperature-1 one.
    core.submit(GenerationRequest("a", prompt, SamplingParams(12, temperature=0.7, top_p=0.9, seed=3)))
    core.submit(GenerationRequest("b", [100], SamplingParams(12, temperature=1.3, top_k=5, seed=4, n=2)))
    for (rid, i), out in run(core).items():
        p = prompt if rid == "a" else [100]
        logp = jax.nn.log_softmax(forward_logits(model, p + out.token_ids), axis=-1)
        want = [float(logp[len(p) - 1 + t, tok]) for t, tok in enumerate(out.token_ids)]
        np.testing.assert_allclose(out.logprobs, want, atol=1e-5, rtol=0)


def test_sampling_with_a_fixed_seed_is_reproducible_whatever_the_slot_and_batch(model):
    params = SamplingParams(16, temperature=1.0, top_p=0.95, n=2, seed=11)
    alone = make_core(model)
    alone.submit(GenerationRequest("r", [4, 5, 6], params))
    alone_out = run(alone)
    crowded = make_core(model)  # other requests take the first slots and share the batches
    crowded.submit(GenerationRequest("x", [9, 9, 9, 9], SamplingParams(10, seed=1)))
    crowded.submit(GenerationRequest("r", [4, 5, 6], params))
    crowded.submit(GenerationRequest("y", [1], SamplingParams(5, seed=2)))
    crowded_out = run(crowded)
    for i in range(2):
        assert alone_out[("r", i)].token_ids == crowded_out[("r", i)].token_ids
    assert alone_out[("r", 0)].token_ids != alone_out[("r", 1)].token_ids
    other = make_core(model)
    other.submit(GenerationRequest("r", [4, 5, 6], SamplingParams(16, top_p=0.95, n=2, seed=12)))
    assert run(other)[("r", 0)].token_ids != alone_out[("r", 0)].token_ids


def test_abort_delivers_tokens_so_far_frees_the_slot_and_admits_the_next_request(model):
    core = make_core(model)
    core.submit(GenerationRequest("a", [1, 2], greedy(30)))
    core.submit(GenerationRequest("b", [3, 4], greedy(30, n=3)))
    core.submit(GenerationRequest("c", [5, 6], greedy(4)))
    core.step()
    core.step()
    assert core.active_slots == 4 and core.queued == 1
    (aborted,) = core.abort("a")
    assert aborted.finish_reason == "abort" and aborted.done
    assert aborted.token_ids == greedy_reference(model, [1, 2], 2)
    assert core.active_slots == 3
    core.step()
    assert core.active_slots == 4 and core.queued == 0
    assert core.abort("a") == [] and core.abort("unknown") == []


def test_abort_of_a_queued_request_ends_each_sample_empty(model):
    core = make_core(model)
    core.submit(GenerationRequest("busy", [1], greedy(5, n=4)))
    core.submit(GenerationRequest("q", [1], greedy(5, n=1)))
    core.step()
    outs = core.abort("q")
    assert [(o.sample_index, o.token_ids, o.finish_reason, o.done) for o in outs] == [(0, [], "abort", True)]
    assert core.queued == 0
    core.submit(GenerationRequest("q", [1], greedy(5)))  # the id is free again


def test_weight_update_between_decode_steps_keeps_in_flight_samples_and_tags_versions_exactly(
        model, other_model):
    new_params = nnx.split(other_model, nnx.Param, ...)[1]
    core = make_core(model)
    core.warmup()  # every decode bucket, so that what follows compiles nothing
    core.submit(GenerationRequest("a", [1, 2, 3], greedy(10)))
    core.submit(GenerationRequest("b", [7], greedy(20)))
    first = run(core, steps=4)  # 4 decode steps: 4 tokens each at version 0
    assert first == {}
    core.update_weights(new_params, version=1)
    before = dict(COMPILE_COUNTS)
    out = run(core)
    assert compiles_since(before) == {}  # the swapped weights reuse the compiled step
    assert out[("a", 0)].versions == [[0, 4], [1, 6]]
    assert out[("b", 0)].versions == [[0, 4], [1, 16]]
    unchanged = greedy_reference(model, [1, 2, 3], 10)
    assert out[("a", 0)].token_ids[:4] == unchanged[:4]
    assert out[("a", 0)].token_ids[4:] != unchanged[4:]  # the new weights really decode
    assert core.version == 1


def test_drain_mode_finishes_in_flight_samples_on_old_weights_before_swapping(model, other_model):
    new_params = nnx.split(other_model, nnx.Param, ...)[1]
    core = make_core(model, sync_mode="drain")
    core.submit(GenerationRequest("old", [1, 2, 3], greedy(8)))
    run(core, steps=3)
    core.update_weights(new_params, version=5)
    assert core.weights_pending and core.version == 0
    core.submit(GenerationRequest("new", [1, 2, 3], greedy(8)))
    out = run(core, steps=5)  # "old" finishes; "new" may not start while it runs
    assert out[("old", 0)].versions == [[0, 8]]
    assert out[("old", 0)].token_ids == greedy_reference(model, [1, 2, 3], 8)
    assert core.queued == 1 and core.version == 0
    out = run(core)
    assert core.version == 5 and not core.weights_pending
    assert out[("new", 0)].versions == [[5, 8]]
    assert out[("new", 0)].token_ids == greedy_reference(other_model, [1, 2, 3], 8)


def test_full_slots_admit_the_lowest_priority_value_first_and_ties_in_submit_order(model):
    core = make_core(model)
    core.submit(GenerationRequest("blocker", [1], greedy(2, n=4)))
    for rid, priority in [("p3", 3.0), ("p1a", 1.0), ("p2", 2.0), ("p1b", 1.0), ("p0", 0.0)]:
        core.submit(GenerationRequest(rid, [1], greedy(2, n=4), priority=priority))
    finished = []
    while core.has_work():
        finished += [o.request_id for o in core.step() if o.sample_index == 0]
    assert finished == ["blocker", "p0", "p1a", "p1b", "p2", "p3"]


def test_a_request_needing_more_slots_than_free_blocks_the_queue_behind_it(model):
    core = make_core(model)
    core.submit(GenerationRequest("three", [1], greedy(4, n=3)))
    core.submit(GenerationRequest("pair", [1], greedy(2, n=2)))
    core.submit(GenerationRequest("late", [1], greedy(2)))
    core.step()
    assert core.active_slots == 3 and core.queued == 2  # "late" would fit but must wait


def test_compile_count_stays_fixed_across_many_requests_of_varying_prompt_length():
    # A model shape no other test uses, so that every compilation below is this test's own.
    core = make_core(peaked_model(cfg=ModelConfig.tiny(intermediate_size=64)), num_slots=3)
    before = dict(COMPILE_COUNTS)
    core.warmup()
    assert compiles_since(before) == {"engine_prefill": 4, "engine_copy_prefix": 4,  # 8..64
                                      "engine_decode_steps": 3}  # 8, 16 (<= 64 / 4) and 64
    before = dict(COMPILE_COUNTS)
    rng = np.random.default_rng(0)
    lengths = [1, 2, 9, 10, 17, 18, 33, 34]  # prefixes in every bucket
    for i, length in enumerate(lengths):
        core.submit(GenerationRequest(f"w{i}", [1] * length, greedy(3, n=1 + i % 3)))
    for i in range(30):
        length = int(rng.integers(1, 50))
        lengths.append(length)
        core.submit(GenerationRequest(f"r{i}", rng.integers(0, 256, length).tolist(),
                                      SamplingParams(int(rng.integers(1, 64 - length + 1)),
                                                     temperature=float(rng.choice([0.0, 1.0])),
                                                     top_k=int(rng.choice([0, 5])),
                                                     n=int(rng.integers(1, 4)))))
    run(core)
    assert compiles_since(before) == {}
    prompts_with_a_prefix = sum(length > 1 for length in lengths)
    assert core.counters["prefills"] == prompts_with_a_prefix
    assert core.counters["prefill_calls"] < prompts_with_a_prefix  # several prompts per call


def test_warmup_compiles_every_bucket_up_front():
    model = peaked_model(cfg=ModelConfig.tiny(intermediate_size=96))
    core = make_core(model, max_len=32)
    before = dict(COMPILE_COUNTS)
    core.warmup()
    assert compiles_since(before) == {"engine_prefill": 3, "engine_copy_prefix": 3,  # 8, 16, 32
                                      "engine_decode_steps": 2}  # 8 (<= 32 / 4) and 32
    before = dict(COMPILE_COUNTS)
    core.submit(GenerationRequest("a", [1] * 20, greedy(3)))
    assert run(core)[("a", 0)].token_ids == greedy_reference(model, [1] * 20, 3)
    assert compiles_since(before) == {}


def test_streamed_pieces_join_to_the_unstreamed_result(model):
    whole = make_core(model)
    streamed = make_core(model, stream_every=3)
    for core in (whole, streamed):
        core.submit(GenerationRequest("a", [1, 2], SamplingParams(10, seed=5, n=2)))
    pieces = []
    while streamed.has_work():
        pieces += streamed.step()
    assert sum(1 for p in pieces if p.request_id == "a" and p.sample_index == 0) == 4  # 3+3+3+1
    assert all(p.done == (p.finish_reason is not None) for p in pieces)
    joined = join_outputs(p for p in pieces if p.sample_index == 0)
    assert joined == run(whole)[("a", 0)]


def test_submit_rejects_requests_that_can_never_run_naming_the_request(model):
    core = make_core(model, max_len=32, num_slots=2)
    with pytest.raises(ValueError, match=r"request 'long': prompt of 20 tokens \+ max_new_tokens=13 = 33 exceeds engine.max_len=32$"):
        core.submit(GenerationRequest("long", [1] * 20, greedy(13)))
    with pytest.raises(ValueError, match=r"^request 'wide': n=3 exceeds engine.num_slots=2$"):
        core.submit(GenerationRequest("wide", [1], greedy(1, n=3)))
    with pytest.raises(ValueError, match=r"^request 'oov': prompt token id 999 is outside the vocabulary \[0, 264\)$"):
        core.submit(GenerationRequest("oov", [1, 999], greedy(1)))
    core.submit(GenerationRequest("dup", [1], greedy(1)))
    with pytest.raises(ValueError, match=r"request 'dup': request_id is already queued"):
        core.submit(GenerationRequest("dup", [1], greedy(1)))


def test_update_weights_rejects_a_wrong_leaf_naming_it(model):
    core = make_core(model)
    good = nnx.to_pure_dict(nnx.split(model, nnx.Param, ...)[1])
    bad_shape = jax.tree.map(lambda x: x, good)
    bad_shape["lm_head"] = jnp.zeros((3, 3))
    with pytest.raises(ValueError, match=r"^params/lm_head is float32\[3, 3\] in the pushed weights; expected float32\[64, 264\]$"):
        core.update_weights(bad_shape, 1)
    bad_dtype = jax.tree.map(lambda x: x, good)
    bad_dtype["embed"] = good["embed"].astype(jnp.bfloat16)
    with pytest.raises(ValueError, match=r"^params/embed is bfloat16\[264, 64\] in the pushed weights; expected float32\[264, 64\]$"):
        core.update_weights(bad_dtype, 1)
    missing = {k: v for k, v in good.items() if k != "final_norm"}
    with pytest.raises(ValueError, match=r"^params/final_norm \(float32\[64\]\) is missing from the pushed weights$"):
        core.update_weights(missing, 1)
    with pytest.raises(ValueError, match=r"^params/extra \(float32\[2\]\) in the pushed weights is unexpected$"):
        core.update_weights({**good, "extra": jnp.zeros(2)}, 1)
    core.update_weights(good, 2)
    with pytest.raises(ValueError, match="version=1 goes backwards"):
        core.update_weights(good, 1)
    assert core.version == 2


# ------------------------------------------------ several decode steps per call, live-length attention


def mixed_requests() -> list[GenerationRequest]:
    """Greedy and seeded (top-p, top-k) samples, n > 1, stop tokens, different lengths; 9 samples
    for 4 slots, so admission happens between calls too."""
    stops = list(range(0, 264, 7))  # 38 stop tokens: some samples stop, on a 64-wide table
    return [GenerationRequest("greedy", [1, 2, 3], greedy(13)),
            GenerationRequest("seeded", [4, 5], SamplingParams(17, seed=3, n=2)),
            GenerationRequest("stops", [6], SamplingParams(30, seed=8, n=2, stop_token_ids=stops)),
            GenerationRequest("nucleus", list(range(9)), SamplingParams(11, seed=4, top_p=0.9, top_k=20)),
            GenerationRequest("short", [9, 9], SamplingParams(1, seed=5)),
            GenerationRequest("long", [3] * 20, SamplingParams(40, seed=6, temperature=0.7))]


def pieces_of(core: EngineCore, requests, *, swap_at=None, abort_at=None, new_params=None) -> dict:
    """Every piece each sample delivered, in order. swap_at / abort_at: after this many generated
    tokens of the first request ("greedy"), push `new_params` as version 1 / abort "seeded"."""
    for r in requests:
        core.submit(r)
    pieces: dict = {}
    while core.has_work():
        done = core.counters["decode_steps"]
        if swap_at is not None and done == swap_at:
            core.update_weights(new_params, version=1)
        if abort_at is not None and done == abort_at:
            for out in core.abort("seeded"):
                pieces.setdefault((out.request_id, out.sample_index), []).append(out)
        for out in core.step():
            pieces.setdefault((out.request_id, out.sample_index), []).append(out)
    return pieces


def assert_identical(got: dict, want: dict) -> None:
    """The same pieces: tokens, versions, finish reasons; log-probs to 1e-5 (attention over a
    shorter cache sums the same terms in another order: they differ by ~4e-6)."""
    assert got.keys() == want.keys()
    for key in want:
        assert [(p.token_ids, p.versions, p.finish_reason, p.done) for p in got[key]] == \
            [(p.token_ids, p.versions, p.finish_reason, p.done) for p in want[key]], key
        np.testing.assert_allclose(np.concatenate([p.logprobs for p in got[key]]),
                                   np.concatenate([p.logprobs for p in want[key]]), atol=1e-5, err_msg=str(key))


@pytest.mark.parametrize("k", [1, 3, 8])
def test_k_steps_per_call_over_live_kv_deliver_what_single_full_length_steps_deliver(model, k):
    # min_bucket = max_len: one attention length, the whole cache: the engine before bucketing.
    want = pieces_of(make_core(model, min_bucket=64, stream_every=4), mixed_requests())
    core = make_core(model, decode_steps_per_call=k, stream_every=4)
    got = pieces_of(core, mixed_requests())
    assert_identical(got, want)
    reasons = {p[-1].finish_reason for p in want.values()}
    assert reasons == {"stop", "length"}
    assert core.counters["decode_calls"] < core.counters["decode_steps"] or k == 1


@pytest.mark.parametrize("k", [4, 8])
def test_k_steps_per_call_match_single_steps_across_a_weight_swap_and_an_abort(model, other_model, k):
    new_params = nnx.split(other_model, nnx.Param, ...)[1]
    # 6 samples in 4 slots after the abort at 8: the swap and the abort land between calls for
    # k = 4 and 8, at the same token of every in-flight sample as with k = 1.
    requests = mixed_requests()[:3]
    want = pieces_of(make_core(model), requests, swap_at=8, abort_at=8, new_params=new_params)
    got = pieces_of(make_core(model, decode_steps_per_call=k), requests, swap_at=8, abort_at=8,
                    new_params=new_params)
    assert_identical(got, want)
    assert join_outputs(want[("greedy", 0)]).versions == [[0, 8], [1, 5]]
    assert [p.finish_reason for p in want[("seeded", 0)]] == ["abort"]


def test_decode_compiles_once_per_live_bucket_used_and_never_on_a_weight_swap():
    # A model shape no other test uses, so that every compilation below is this test's own.
    model = peaked_model(cfg=ModelConfig.tiny(intermediate_size=80))
    core = make_core(model, decode_steps_per_call=4)
    before = dict(COMPILE_COUNTS)
    core.submit(GenerationRequest("a", [1, 2], greedy(12)))  # positions 1..12: buckets 8, 16
    run(core)
    assert compiles_since(before).get("engine_decode_steps") == 2
    core.update_weights(params_of(peaked_model(seed=1, cfg=model.cfg)), version=1)
    before = dict(COMPILE_COUNTS)
    core.submit(GenerationRequest("b", [3, 4], greedy(12)))
    run(core)
    assert compiles_since(before) == {}
    core.submit(GenerationRequest("c", [3] * 20, greedy(12)))  # positions 19..30: bucket 32 > 64 / 4
    run(core)
    assert compiles_since(before) == {"engine_prefill": 1, "engine_decode_steps": 1}  # 32; decode at 64


def test_engine_config_rejects_a_non_positive_decode_steps_per_call():
    with pytest.raises(ValueError, match=r"EngineConfig.decode_steps_per_call=0: must be an int >= 1"):
        EngineConfig(decode_steps_per_call=0)
