"""The JAX engine's host-side bookkeeping: the priority queue and the per-slot sequence."""

from jaxrl_async.engines.base import GenerationRequest, SamplingParams
from jaxrl_async.engines.jax.scheduler import RequestQueue, SlotSequence


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
