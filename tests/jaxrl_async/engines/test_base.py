"""The engine contract's records: sampling parameters, requests, and joined output pieces."""

import pytest

from jaxrl_async.engines.base import GenerationRequest, SampleOutput, SamplingParams, join_outputs


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
