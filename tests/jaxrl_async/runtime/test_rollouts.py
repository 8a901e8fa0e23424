"""Assembling streamed engine pieces into groups."""

import pytest

from jaxrl_async.engines.base import SampleOutput
from jaxrl_async.runtime.rollouts import GroupRollout, RolloutCollector


def piece(rid, index, tokens, versions, done=False, reason=None):
    return SampleOutput(rid, index, tokens, [-0.5] * len(tokens), versions, reason, done)


def test_the_first_piece_starts_the_group_with_its_first_tokens_version():
    c = RolloutCollector()
    c.open(uid=3, prompt_id="p", prompt_ids=[1, 2], n=2, attempt=0)
    first = c.add(piece("3.0", 1, [5, 6], [[2, 1], [3, 1]]))
    assert first.started_version == 2 and first.new_tokens == [(2, 1), (3, 1)] and not first.group_done
    second = c.add(piece("3.0", 0, [7], [[3, 1]]))
    assert second.started_version is None


def test_a_group_is_done_when_all_its_samples_are_and_counts_tokens_by_version():
    c = RolloutCollector()
    g = c.open(uid=0, prompt_id="p", prompt_ids=[1], n=2, attempt=0)
    c.add(piece("0.0", 0, [5, 6], [[0, 2]]))
    assert not c.add(piece("0.0", 0, [7], [[1, 1]], done=True, reason="stop")).group_done
    assert c.add(piece("0.0", 1, [8, 9, 10], [[0, 1], [1, 2]], done=True, reason="length")).group_done
    assert g.token_versions() == [(0, 3), (1, 3)]
    assert g.last_versions() == [1, 1]
    assert g.samples[0].token_ids == [5, 6, 7] and g.samples[0].versions == [[0, 2], [1, 1]]
    assert len(c) == 0  # a done group leaves the collector


def test_pieces_of_unknown_or_superseded_requests_are_ignored():
    c = RolloutCollector()
    old = c.open(uid=4, prompt_id="p", prompt_ids=[1], n=1, attempt=0)
    c.close(old)
    c.open(uid=4, prompt_id="p", prompt_ids=[1], n=1, attempt=1)
    assert c.add(piece("4.0", 0, [], [], done=True, reason="abort")) is None
    assert c.add(piece("9.0", 0, [1], [[0, 1]])) is None
    assert c.add(piece("4.1", 0, [1], [[0, 1]], done=True)).group_done


def test_a_piece_after_a_samples_done_piece_is_an_engine_bug():
    c = RolloutCollector()
    c.open(uid=1, prompt_id="p", prompt_ids=[1], n=2, attempt=0)
    c.add(piece("1.0", 0, [1], [[0, 1]], done=True))
    with pytest.raises(ValueError, match="after its done piece"):
        c.add(piece("1.0", 0, [2], [[0, 1]]))


def test_a_group_survives_a_json_round_trip():
    c = RolloutCollector()
    g = c.open(uid=2, prompt_id="p", prompt_ids=[1, 2], n=1, attempt=3)
    c.add(piece("2.3", 0, [5], [[4, 1]], done=True, reason="stop"))
    g.rewards, g.reward_errors = [0.5], 0
    back = GroupRollout.from_json(g.to_json())
    assert back.to_json() == g.to_json() and back.request_id == "2.3"
