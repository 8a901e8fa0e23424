"""The engine contract's records: sampling parameters, requests, and joined output pieces."""

import pytest

from jaxrl_async.engines.base import (GenerationRequest, RequestLimits, SampleOutput, SamplingParams,
                                      check_new_request_id, join_outputs)


@pytest.mark.parametrize("kwargs, message", [
    (dict(max_new_tokens=0), "max_new_tokens=0"),
    (dict(max_new_tokens=4, temperature=-1.0), "temperature=-1.0"),
    (dict(max_new_tokens=4, top_p=0.0), "top_p=0.0"),
    (dict(max_new_tokens=4, top_k=-2), "top_k=-2"),
    (dict(max_new_tokens=4, n=0), "n=0"),
    (dict(max_new_tokens=4, seed=2**32), "seed=4294967296"),
])
def test_sampling_params_reject_bad_values_naming_the_field(kwargs, message):
    with pytest.raises(ValueError, match=f"SamplingParams.{message}"):
        SamplingParams(**kwargs)


def test_an_empty_prompt_is_rejected_naming_the_request():
    with pytest.raises(ValueError, match="request 'x': prompt_ids is empty"):
        GenerationRequest("x", [], SamplingParams(4))


def test_joined_pieces_concatenate_tokens_and_merge_version_runs():
    pieces = [SampleOutput("r", 1, [1, 2], [-0.1, -0.2], [[0, 2]]),
              SampleOutput("r", 1, [3], [-0.3], [[0, 1]]),
              SampleOutput("r", 1, [4, 5], [-0.4, -0.5], [[1, 2]], "stop", True)]
    joined = join_outputs(pieces)
    assert joined == SampleOutput("r", 1, [1, 2, 3, 4, 5], [-0.1, -0.2, -0.3, -0.4, -0.5],
                                  [[0, 3], [1, 2]], "stop", True)
    assert pieces[0].versions == [[0, 2]]  # inputs untouched
    with pytest.raises(ValueError, match="several samples"):
        join_outputs([pieces[0], SampleOutput("r", 0, [], [], [])])


LIMITS = RequestLimits(context=16, context_key="engine.max_model_len", samples=4, samples_key="engine.max_num_seqs",
                       vocab_size=10)


def test_a_request_that_fits_the_limits_exactly_passes():
    LIMITS.check(GenerationRequest("edge", [9] * 12, SamplingParams(4, n=4)))


@pytest.mark.parametrize("request_, message", [
    (GenerationRequest("long", [1] * 13, SamplingParams(4)),
     "request 'long': prompt of 13 tokens + max_new_tokens=4 = 17 exceeds engine.max_model_len=16"),
    (GenerationRequest("wide", [1], SamplingParams(4, n=5)), "request 'wide': n=5 exceeds engine.max_num_seqs=4"),
    (GenerationRequest("oov", [1, 10, -1], SamplingParams(4)),
     "request 'oov': prompt token id 10 is outside the vocabulary [0, 10)"),
    (GenerationRequest("neg", [-1], SamplingParams(4)),
     "request 'neg': prompt token id -1 is outside the vocabulary [0, 10)"),
])
def test_a_request_that_can_never_run_is_one_line_naming_it_the_limit_and_its_key(request_, message):
    with pytest.raises(ValueError) as info:
        LIMITS.check(request_)
    assert str(info.value) == message


def test_a_live_request_id_is_refused():
    check_new_request_id("a", {"b": 1})
    with pytest.raises(ValueError, match=r"^request 'a': request_id is already queued or running$"):
        check_new_request_id("a", {"a": 1})
