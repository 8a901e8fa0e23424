"""RpcDeadlines: a worker call's deadline follows the observed answer times, within floor and ceiling."""

from __future__ import annotations

import pytest

from jaxrl_async.cluster.deadlines import RpcDeadlines


def test_a_kind_never_answered_gets_the_ceiling():
    assert RpcDeadlines(floor_s=10, ceiling_s=120).timeout_s("update_weights") == 120


def test_the_deadline_is_twenty_times_the_p99_of_the_answers_within_floor_and_ceiling():
    d = RpcDeadlines(floor_s=10, ceiling_s=120)
    for _ in range(100):
        d.observe("poll", 0.01)
    assert d.timeout_s("poll") == 10  # 20 x 0.01 s is under the floor
    for _ in range(100):
        d.observe("update_weights", 2.0)
    assert d.timeout_s("update_weights") == pytest.approx(40)  # follows the slow kind alone
    d.observe("update_weights", 30.0)
    d.observe("update_weights", 30.0)
    d.observe("update_weights", 30.0)
    assert d.timeout_s("update_weights") == 120  # 20 x p99 = 600 s: the ceiling
    assert d.timeout_s("poll") == 10


def test_the_p99_forgets_answers_older_than_the_window():
    d = RpcDeadlines(floor_s=1, ceiling_s=100, window=10)
    d.observe("submit", 4.0)
    assert d.timeout_s("submit") == 80
    for _ in range(10):
        d.observe("submit", 0.1)
    assert d.timeout_s("submit") == pytest.approx(2)


def test_an_explicit_rpc_timeout_overrides_the_rule_for_every_kind():
    d = RpcDeadlines(floor_s=10, ceiling_s=120, override_s=5)
    d.observe("poll", 3.0)
    assert d.timeout_s("poll") == d.timeout_s("update_weights") == 5


def test_late_is_softer_than_lost():
    d = RpcDeadlines(floor_s=10, ceiling_s=120)
    d.observe("poll", 0.01)
    assert d.late_s("poll") == 1.0 < d.timeout_s("poll")
    d.observe("poll", 2.0)
    assert d.late_s("poll") == 6.0


def test_a_floor_above_the_ceiling_is_a_one_line_error():
    with pytest.raises(ValueError, match=r"^cluster.rpc_timeout_floor_s=50: must be > 0 and <= "):
        RpcDeadlines(floor_s=50, ceiling_s=20)
