"""The vLLM engine's pure conversions, run where vLLM is absent (engines/vllm/convert.py): the
sampling settings of a vLLM request, how its finish reason ends or continues a sample, its
priority, vLLM's weight-version spans as run-length versions, `engine.speculation.*` as
vLLM's speculative_config, and LoRA's engine arguments and adapter bookkeeping (sync mode pinned)."""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

from jaxrl_async.engines.base import SamplingParams
from jaxrl_async.engines.speculation import SpeculationConfig
from jaxrl_async.engines.vllm import convert
from jaxrl_async.engines.vllm.convert import (AdapterVersions, lora_engine_args, max_lora_rank, piece_finish,
                                              pinned_versions, sampling_kwargs, speculative_config,
                                              versions_from_spans, vllm_priority)


@dataclass(frozen=True)
class Span:  # vLLM's WeightVersionSpan: the version is a string, [start, end) token positions
    version: str
    start: int
    end: int


def test_a_fresh_request_keeps_its_seed_and_maps_no_top_k_to_vllms_minus_one():
    sp = SamplingParams(max_new_tokens=16, temperature=0.7, top_p=0.9, stop_token_ids=(2, 5), n=4, seed=11)
    assert sampling_kwargs(sp, 4, 0, 16) == dict(
        n=4, max_tokens=16, temperature=0.7, top_p=0.9, top_k=-1, seed=11, stop_token_ids=[2, 5],
        ignore_eos=True, logprobs=0, detokenize=False)
    assert sampling_kwargs(SamplingParams(max_new_tokens=4, top_k=3, n=2), 2, 0, 4)["top_k"] == 3
    assert sampling_kwargs(SamplingParams(max_new_tokens=4, top_k=1, n=2), 2, 0, 4)["top_k"] == 1


def test_a_resubmitted_sample_continues_with_its_remaining_tokens_and_its_own_seed():
    sp = SamplingParams(max_new_tokens=16, n=4, seed=100)
    one = sampling_kwargs(sp, 1, 3, 9)
    assert (one["n"], one["max_tokens"], one["seed"]) == (1, 9, 103)  # sample 3's own random stream
    assert sampling_kwargs(sp, 2, 3, 9)["seed"] == 100  # several samples: vLLM offsets them itself
    assert sampling_kwargs(SamplingParams(max_new_tokens=16, n=4), 1, 3, 9)["seed"] is None


@pytest.mark.parametrize("priority,expected", [(3.0, 3), (3.9, 3), (-0.5, -1), (0.0, 0)])
def test_the_vllm_priority_is_the_deadline_floored(priority, expected):
    assert vllm_priority(priority) == expected and isinstance(vllm_priority(priority), int)


@pytest.mark.parametrize("reason,resubmit,user_aborted,remaining,expected", [
    ("stop", False, False, 5, ("stop", False)),
    ("length", False, False, 0, ("length", False)),
    ("abort", False, True, 5, ("abort", False)),  # the user's abort
    ("abort", True, False, 5, (None, True)),  # a resubmit update's abort: the sample goes on
    ("abort", True, False, 1, (None, True)),
    ("abort", True, True, 5, ("abort", False)),  # ... unless the user aborted it too
    ("abort", True, False, 0, ("abort", False)),  # ... or it has no token left
    ("stop", True, False, 5, ("stop", False)),  # a sample that ended before the abort landed
    ("error", False, False, 5, ("stop", False)),  # vLLM's other reasons end the sample
])
def test_a_finish_reason_ends_the_sample_or_continues_it_after_a_resubmit(reason, resubmit, user_aborted,
                                                                           remaining, expected):
    assert piece_finish(reason, resubmit=resubmit, user_aborted=user_aborted, remaining=remaining) == expected


def test_version_spans_become_runs_merging_equal_versions_and_skipping_empty_spans():
    spans = [Span("2", 0, 3), Span("2", 3, 4), Span("3", 4, 4), Span("3", 4, 6)]
    assert versions_from_spans(spans, 6) == [[2, 4], [3, 2]]
    assert versions_from_spans([Span("0", 5, 6)], 1) == [[0, 1]]


def test_version_spans_must_cover_exactly_the_samples_tokens():
    assert versions_from_spans(None, 0) == [] and versions_from_spans([Span("1", 0, 3)], 0) == []
    with pytest.raises(RuntimeError, match="returned 2 tokens without weight-version spans"):
        versions_from_spans([], 2)
    with pytest.raises(RuntimeError, match="spans cover 3 tokens, the sample has 4"):
        versions_from_spans([Span("1", 0, 3)], 4)
    with pytest.raises(RuntimeError, match="spans cover 3 tokens, the sample has 2"):
        versions_from_spans([Span("1", 0, 3)], 2)


def test_the_conversions_import_neither_vllm_nor_torch():
    tree = ast.parse(Path(convert.__file__).read_text())
    imported = {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    imported |= {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert not imported & {"vllm", "torch", "jax"}, imported


def test_speculation_never_passes_no_speculative_config():
    assert speculative_config(SpeculationConfig(), 32) is None


def test_ngram_speculation_maps_onto_vllms_prompt_lookup_with_a_batch_size_gate():
    spec = SpeculationConfig(when="always", method="ngram", tokens=3, ngram=2, max_active=4)
    assert speculative_config(spec, 32) == dict(
        method="ngram", num_speculative_tokens=3, prompt_lookup_min=2, prompt_lookup_max=2,
        rejection_sample_method="standard", num_speculative_tokens_per_batch_size=[(1, 4, 3), (5, 32, 0)])
    # max_active covers every slot: every step speculates, no schedule is passed.
    assert "num_speculative_tokens_per_batch_size" not in speculative_config(spec, 4)


def test_a_draft_model_directory_becomes_vllms_draft_model():
    spec = SpeculationConfig(when="always", method="draft", tokens=5, draft_model="/models/draft", max_active=64)
    assert speculative_config(spec, 64) == dict(
        method="draft_model", model="/models/draft", num_speculative_tokens=5, rejection_sample_method="standard")


def test_vllm_refuses_per_request_speculation_and_the_policys_own_layers_in_one_line():
    with pytest.raises(ValueError, match=r"^engine\.speculation\.when='critical': vLLM cannot speculate per "
                                         r"request .*engine\.speculation\.when=always.*$") as error:
        speculative_config(SpeculationConfig(when="critical"), 32)
    assert "\n" not in str(error.value)
    with pytest.raises(ValueError, match=r"^engine\.speculation\.draft_model='layers:1': layers:N .* is "
                                         r"engine=jax's only; engine=vllm needs a draft model's HF directory$"):
        speculative_config(SpeculationConfig(when="always", method="draft", draft_model="layers:1"), 32)


def test_the_vllm_engine_config_refuses_unmappable_speculation_when_built_from_the_command_line():
    from jaxrl_async.engines.registry import engine_config

    assert engine_config("vllm", {"speculation": {"when": "always"}}).speculation.when == "always"
    with pytest.raises(ValueError, match=r"^engine\.speculation\.when='critical': vLLM cannot"):
        engine_config("vllm", {"speculation": {"when": "critical"}})
    with pytest.raises(ValueError, match=r"^engine\.engine_args\.speculative_config=.*: set engine\.speculation\.\* "
                                         r"or this, not both$"):
        engine_config("vllm", {"speculation": {"when": "always"}, "engine_args": {"speculative_config": {}}})


@pytest.mark.parametrize(("rank", "width"), [(1, 1), (2, 8), (8, 8), (9, 16), (16, 16), (33, 64), (512, 512)])
def test_vllms_max_lora_rank_is_the_smallest_admissible_width_at_least_the_rank(rank, width):
    assert max_lora_rank(rank) == width


def test_a_lora_rank_vllm_cannot_serve_is_refused_naming_the_trainer_key():
    with pytest.raises(ValueError, match=r"^trainer.lora.rank=513: engine=vllm serves LoRA ranks 1..512"):
        max_lora_rank(513)


def test_lora_engine_args_hold_every_pinned_version_in_a_batch_and_one_more_in_the_cache():
    assert lora_engine_args(12, 3) == dict(enable_lora=True, max_lora_rank=16, max_loras=3, max_cpu_loras=4)


def test_pinned_tokens_are_all_the_admission_version_and_vllms_spans_must_name_the_base():
    assert pinned_versions([Span("0", 0, 3), Span("0", 3, 7)], 7, 5, 0) == [[5, 7]]
    assert pinned_versions(None, 0, 5, 0) == []
    with pytest.raises(RuntimeError, match="the base weights are version 0 and never change"):
        pinned_versions([Span("0", 0, 3), Span("4", 3, 7)], 7, 5, 0)
    with pytest.raises(RuntimeError, match="cover 3 tokens, the sample has 7"):
        pinned_versions([Span("0", 0, 3)], 7, 5, 0)


def test_an_old_adapter_is_removed_once_its_last_request_ends_and_never_the_newest():
    book = AdapterVersions()
    assert book.acquire() is None and book.release(None) == []  # before any push: the base, no adapter
    assert book.add(1) == [] and book.acquire() == 1 and book.acquire() == 1
    assert book.add(2) == []  # v1 still has two requests
    assert book.acquire() == 2  # new requests get the newest
    assert book.release(1) == [] and book.release(1) == [1]  # v1's last request ended
    assert book.release(2) == []  # v2 is the newest: kept for the next requests
    assert book.add(3) == [2]  # v2 idle once v3 arrives
    assert (sorted(book.users), book.added, book.removed) == ([3], 3, 2)
    with pytest.raises(ValueError, match="adapter version=3 is already resident"):
        book.add(3)
