"""The vLLM engine's pure conversions, run where vLLM is absent (engines/vllm/convert.py): the
sampling settings of a vLLM request, how its finish reason ends or continues a sample, its
priority, vLLM's weight-version spans as run-length versions, and `engine.speculation.*` as
vLLM's speculative_config."""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

from jaxrl_async.engines.base import SamplingParams
from jaxrl_async.engines.speculation import SpeculationConfig
from jaxrl_async.engines.vllm import convert
from jaxrl_async.engines.vllm.convert import (piece_finish, sampling_kwargs, speculative_config, versions_from_spans,
                                              vllm_priority)


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
