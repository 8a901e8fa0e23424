"""The engine contract's records and the host-side queue."""

import pytest

from jaxrl_async.engines.base import GenerationRequest, SampleOutput, SamplingParams, join_outputs
from jaxrl_async.engines.jax.scheduler import RequestQueue, SlotSequence


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


def request(rid: str, priority: float, n: int = 1) -> GenerationRequest:
    return GenerationRequest(rid, [1], SamplingParams(4, n=n), priority)


def test_queue_pops_lowest_priority_first_ties_in_submit_order_and_stops_at_a_head_that_does_not_fit():
    queue = RequestQueue()
    for rid, priority, n in [("c", 2.0, 1), ("a1", 1.0, 1), ("big", 1.5, 3), ("a2", 1.0, 1)]:
        queue.push(request(rid, priority, n))
    assert [r.request_id for r in queue.pop_admissible(4)] == ["a1", "a2"]  # "big" needs 3 > 2
    assert "big" in queue and len(queue) == 2
    assert queue.remove("big").request_id == "big" and queue.remove("big") is None
    assert [r.request_id for r in queue.pop_admissible(1)] == ["c"]


def test_sequence_ends_on_a_stop_token_or_at_max_new_tokens_and_tags_versions():
    seq = SlotSequence("r", 0, last_token=5, position=3, max_new_tokens=3, stop_token_ids=frozenset({9}))
    assert seq.append(7, -1.0, version=0) is None
    assert seq.append(8, -2.0, version=1) is None
    assert seq.position == 5 and seq.last_token == 8
    piece = seq.flush()
    assert (piece.token_ids, piece.versions, piece.done) == ([7, 8], [[0, 1], [1, 1]], False)
    assert seq.append(6, -3.0, version=1) == "length"
    stopper = SlotSequence("s", 0, last_token=5, position=0, max_new_tokens=10, stop_token_ids=frozenset({9}))
    assert stopper.append(9, -0.5, version=0) == "stop"
