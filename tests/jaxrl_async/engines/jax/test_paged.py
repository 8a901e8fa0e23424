"""PagedEngineCore against the contiguous engine: the same tokens, log-probs and versions on mixed
lengths, aborts, weight swaps, several steps per call, preemption and tensor-parallel replicas;
pages never leak."""

import jax
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jaxrl_async.engines.base import GenerationRequest, SamplingParams, join_outputs
from jaxrl_async.engines.jax.compiles import COMPILE_COUNTS
from jaxrl_async.engines.jax.config import EngineConfig
from jaxrl_async.engines.jax.core import EngineCore
from jaxrl_async.engines.jax.engine import make_core
from jaxrl_async.engines.jax.paged import PagedEngineCore
from jaxrl_async.models.config import ModelConfig
from tests.helpers.engines import mesh_of, params_of
from tests.jaxrl_async.engines.jax.test_core import (assert_identical, compiles_since, greedy,
                                                     greedy_reference, mixed_requests, peaked_model,
                                                     pieces_of, run)
from tests.jaxrl_async.engines.jax.test_core import make_core as contiguous_core

ENGINE = dict(num_slots=4, max_len=64, min_bucket=8, decode_steps_per_call=1)  # test_core's shape


@pytest.fixture(scope="module")
def model():
    return peaked_model()


@pytest.fixture(scope="module")
def other_model():
    return peaked_model(seed=1)


def paged_core(model, mesh=None, **overrides) -> PagedEngineCore:
    core = make_core(model, model.cfg, EngineConfig(**{**ENGINE, "page_size": 8, **overrides}), mesh=mesh)
    assert isinstance(core, PagedEngineCore)
    return core


def checked(core: PagedEngineCore):
    """`core` whose page tables are checked after every step (free + used = total, refs = holders)."""
    step = core.step

    def step_and_check():
        out = step()
        core.pages.check()
        return out

    core.step = step_and_check
    return core


def test_page_size_zero_is_the_contiguous_core_and_paged_keys_are_validated():
    assert type(make_core(peaked_model(), ModelConfig.tiny(), EngineConfig(**ENGINE))) is EngineCore
    with pytest.raises(ValueError, match=r"^engine.page_size=12: must divide engine.max_len=64$"):
        EngineConfig(**ENGINE, page_size=12)
    with pytest.raises(ValueError, match=r"^engine.page_size=-1: must be an int >= 0"):
        EngineConfig(**ENGINE, page_size=-1)
    with pytest.raises(ValueError, match=r"^engine.kv_pages=7: must be an int >= max_len / page_size = 8"):
        EngineConfig(**ENGINE, page_size=8, kv_pages=7)
    with pytest.raises(ValueError, match=r"^engine.kv_pages=8: needs engine.page_size > 0$"):
        EngineConfig(**ENGINE, kv_pages=8)
    assert EngineConfig(**ENGINE, page_size=8).total_pages == 4 * 64 // 8
    assert EngineConfig(**ENGINE).kv_tokens == 4 * 64 == EngineConfig(**ENGINE, page_size=8).kv_tokens
    assert EngineConfig(**ENGINE, page_size=8, kv_pages=10).kv_tokens == 80


@pytest.mark.parametrize("k, page_size, kv_pages", [(1, 8, None), (3, 8, None), (8, 8, None), (4, 16, 4)])
def test_paged_core_delivers_what_the_contiguous_core_delivers_on_mixed_lengths(model, k, page_size, kv_pages):
    # kv_pages=4 of 16: 64 positions for 4 slots ("greedy" and "seeded"'s two samples already need
    # 5 pages), so samples are preempted and resume; pages larger than min_bucket.
    want = pieces_of(contiguous_core(model, min_bucket=64, stream_every=4), mixed_requests())
    core = checked(paged_core(model, decode_steps_per_call=k, stream_every=4, page_size=page_size,
                              kv_pages=kv_pages))
    got = pieces_of(core, mixed_requests())
    assert_identical(got, want)
    assert (core.counters["preemptions"] > 0) == (kv_pages is not None)
    assert core.pages.pool.free == core.pages.pool.total and core.queued == 0


@pytest.mark.parametrize("k", [1, 4])
def test_paged_core_matches_across_a_weight_swap_and_an_abort(model, other_model, k):
    new_params = params_of(other_model)
    requests = mixed_requests()[:3]
    want = pieces_of(contiguous_core(model), requests, swap_at=8, abort_at=8, new_params=new_params)
    core = checked(paged_core(model, decode_steps_per_call=k))
    got = pieces_of(core, requests, swap_at=8, abort_at=8, new_params=new_params)
    assert_identical(got, want)
    assert join_outputs(want[("greedy", 0)]).versions == [[0, 8], [1, 5]]
    assert core.pages.pool.free == core.pages.pool.total


def crowded_requests() -> list[GenerationRequest]:
    """3 samples of 42-43 positions: 3 pages of 16 each, for 4 pages in all (kv_pages=4)."""
    return [GenerationRequest("a", [1, 2, 3], SamplingParams(40, seed=1)),
            GenerationRequest("b", [4, 5], SamplingParams(40, seed=2, n=2))]


def test_a_sample_preempted_after_a_weight_swap_resumes_with_its_keys_and_values_unchanged(model, other_model):
    # The swap comes after 8 tokens, the preemptions later: a preempted sample's keys and values
    # (8 positions from the old weights, the rest from the new) come back exactly as they were,
    # so it samples what the contiguous engine samples. (Recomputing them would not.)
    new_params = params_of(other_model)
    want = pieces_of(contiguous_core(model), crowded_requests(), swap_at=8, new_params=new_params)
    core = checked(paged_core(model, decode_steps_per_call=4, page_size=16, kv_pages=4))
    got = pieces_of(core, crowded_requests(), swap_at=8, new_params=new_params)
    assert_identical(got, want)
    assert core.counters["preemptions"] > 0 and core.version == 1
    assert join_outputs(want[("b", 1)]).versions == [[0, 8], [1, 32]]


def test_a_sample_preempted_while_the_weights_swap_keeps_its_tokens_versions(model, other_model):
    # Swapped while a sample waits preempted: its tokens so far stay version 0, the rest are
    # version 1 (it resumes later than it would have run in the contiguous engine: later weights).
    core = checked(paged_core(model, decode_steps_per_call=4, page_size=16, kv_pages=4))
    for r in crowded_requests():
        core.submit(r)
    pieces: dict = {}

    def collect(outputs):
        for out in outputs:
            pieces.setdefault((out.request_id, out.sample_index), []).append(out)

    while not core.preempted:
        collect(core.step())
    waiting = core.preempted[0]
    generated = waiting.generated
    core.update_weights(params_of(other_model), version=1)
    while core.has_work():
        collect(core.step())
    out = join_outputs(pieces[(waiting.request_id, waiting.sample_index)])
    assert 0 < generated < 40 and out.versions == [[0, generated], [1, 40 - generated]]
    assert len(out.token_ids) == 40 and core.pages.pool.free == 4


def test_drain_mode_resumes_preempted_samples_on_the_old_weights_before_the_swap(model, other_model):
    core = checked(paged_core(model, sync_mode="drain", kv_pages=8, decode_steps_per_call=2))
    core.submit(GenerationRequest("a", [1, 2, 3], greedy(40)))
    core.submit(GenerationRequest("b", [4, 5], greedy(40, n=2)))
    run(core, steps=2)
    core.update_weights(params_of(other_model), version=1)
    out = run(core)
    assert core.counters["preemptions"] > 0 and core.version == 1
    assert out[("a", 0)].versions == [[0, 40]] and out[("b", 1)].versions == [[0, 40]]
    assert out[("a", 0)].token_ids == greedy_reference(model, [1, 2, 3], 40)
    assert out[("b", 1)].token_ids == greedy_reference(model, [4, 5], 40)


def test_a_group_prefills_its_prompt_once_and_shares_its_full_prompt_pages(model):
    core = checked(paged_core(model))
    prompt = list(range(20, 40))  # prefix 19 positions: pages 0-1 full, page 2 partial
    core.submit(GenerationRequest("g", prompt, greedy(6, n=3)))
    core.step()
    tables = core.pages.pages
    slots = [s for s, seq in enumerate(core.slots.seqs) if seq is not None]
    assert len({tuple(tables[s][:2]) for s in slots}) == 1  # the same two full pages
    assert len({tables[s][2] for s in slots}) == 3  # each its own partial page
    assert core.pages.pool.used == 2 + 3
    results = run(core)
    assert [results[("g", i)].token_ids for i in range(3)] == [greedy_reference(model, prompt, 6)] * 3
    assert core.counters["prefills"] == 1 and core.counters["prefill_tokens"] == len(prompt) - 1


def test_admission_counts_pages_so_more_samples_decode_than_max_len_reservations_allow(model):
    # 16 pages of 8 = 128 positions: the contiguous engine would hold 2 slots of max_len 64.
    core = checked(paged_core(model, num_slots=8, kv_pages=16, decode_steps_per_call=4))
    for i in range(8):
        core.submit(GenerationRequest(f"r{i}", [1 + i, 2], greedy(5)))
    core.step()
    assert core.active_slots == 8 and core.pages.pool.used == 8
    results = run(core)
    assert all(results[(f"r{i}", 0)].token_ids == greedy_reference(model, [1 + i, 2], 5) for i in range(8))
    assert core.counters["preemptions"] == 0


def test_a_request_whose_group_can_never_fit_is_refused_at_submit(model):
    core = paged_core(model, kv_pages=8)
    # prefix of 59 positions: 7 full pages shared, then 4 partial pages of their own: 11 > 8.
    with pytest.raises(ValueError, match=r"^request 'big': n=4 samples of a 60-token prompt need 11 KV pages "
                                         r"at admission, more than engine.kv_pages=8$"):
        core.submit(GenerationRequest("big", [1] * 60, greedy(4, n=4)))
    core.submit(GenerationRequest("fits", [1] * 60, greedy(4, n=1)))  # 8 pages


def test_abort_of_a_preempted_sample_ends_it_with_its_tokens_and_frees_nothing_twice(model):
    core = checked(paged_core(model, kv_pages=8, decode_steps_per_call=2))
    core.submit(GenerationRequest("old", [1, 2, 3], greedy(50)))
    core.submit(GenerationRequest("young", [4, 5], greedy(50)))
    while not core.preempted:
        core.step()
    (out,) = core.abort("young")
    assert out.finish_reason == "abort" and out.done and core.queued == 0
    assert run(core)[("old", 0)].token_ids == greedy_reference(model, [1, 2, 3], 50)
    assert core.pages.pool.free == 8


def test_warmup_compiles_every_paged_step_and_nothing_compiles_after_it():
    model = peaked_model(cfg=ModelConfig.tiny(intermediate_size=112))  # this test's own shape
    core = paged_core(model, decode_steps_per_call=4, kv_pages=13)  # a cache shape of its own too
    before = dict(COMPILE_COUNTS)
    core.warmup()
    assert compiles_since(before) == {"engine_prefill_paged": 4,  # buckets 8..64
                                      "engine_copy_page": 1, "engine_read_pages": 1, "engine_write_pages": 1,
                                      "engine_decode_steps": 4}  # 8, 16, 32, 64: no max_len cut-off
    before = dict(COMPILE_COUNTS)
    # No request with more than 4 stop tokens (a wider stop table compiles the decode step again).
    pieces_of(core, [r for r in mixed_requests() if r.request_id != "stops"] + crowded_requests())
    assert compiles_since(before) == {} and core.counters["preemptions"] > 0


def test_tensor_parallel_paged_core_samples_what_one_device_samples_across_a_swap(model, other_model):
    requests = crowded_requests()
    want = pieces_of(contiguous_core(model), requests, swap_at=8, new_params=params_of(other_model))
    tp = checked(paged_core(model, mesh=mesh_of(jax.devices()[:2]), page_size=16, kv_pages=4,
                            decode_steps_per_call=4))
    got = pieces_of(tp, requests, swap_at=8, new_params=params_of(other_model))
    assert_identical(got, want)
    assert tp.cache.k[0].sharding.spec[1] == "tensor"  # kv heads sharded, pages whole
    assert tp.counters["preemptions"] > 0


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.sampled_from(["submit", "abort", "step"]), st.integers(0, 5),
                          st.integers(1, 30), st.integers(1, 3)), min_size=5, max_size=25))
def test_pages_never_leak_over_random_submit_abort_finish_sequences(model, ops):
    core = checked(paged_core(model, kv_pages=10, decode_steps_per_call=4))
    for op, rid, length, n in ops:
        if op == "submit" and f"r{rid}" not in core.requests:
            core.submit(GenerationRequest(f"r{rid}", [7] * length, SamplingParams(64 - length, seed=rid, n=n)))
        elif op == "abort":
            core.abort(f"r{rid}")
        else:
            core.step()
        core.pages.check()
    run(core)
    assert core.pages.pool.free == core.pages.pool.total and not core.requests
