"""`engine.speculation.*`: the keys both engines read, and their one-line errors."""

import pytest

from jaxrl_async.engines.speculation import MAX_TOKENS, SpeculationConfig


def test_speculation_is_off_by_default_so_every_existing_figure_stays_as_it_is():
    assert not SpeculationConfig().enabled
    assert SpeculationConfig(when="critical").enabled and SpeculationConfig(when="always").enabled


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"when": "sometimes"}, r"engine.speculation.when='sometimes': must be one of never, critical, always"),
    ({"method": "eagle"}, r"engine.speculation.method='eagle': must be one of ngram, draft"),
    ({"tokens": 0}, r"engine.speculation.tokens=0: must be an int >= 1"),
    ({"tokens": True}, r"engine.speculation.tokens=True: must be an int >= 1"),
    ({"max_active": 0}, r"engine.speculation.max_active=0"),
    ({"tokens": 100}, r"engine.speculation.tokens=100: must be <= 16 \(a longer draft adds almost no kept tokens"),
    ({"method": "draft"}, r"engine.speculation.draft_model=None: must be set when engine.speculation.method=draft"),
])
def test_a_bad_speculation_key_is_a_one_line_error_naming_it(kwargs, message):
    with pytest.raises(ValueError, match=message) as info:
        SpeculationConfig(**kwargs)
    assert "\n" not in str(info.value)


def test_tokens_are_bounded_where_a_longer_draft_stops_paying():
    # At acceptance 0.8 a verification keeps (1 - a^(k+1)) / (1 - a) tokens, at most 1 / (1 - a) = 5.
    kept = lambda k, a=0.8: (1 - a ** (k + 1)) / (1 - a)  # noqa: E731
    assert kept(MAX_TOKENS) / 5 > 0.97
    assert SpeculationConfig(tokens=MAX_TOKENS).tokens == 16


def test_the_weight_bound_regime_counts_query_positions_as_the_simulator_does():
    # planner/sim/workers.py `_spec_now`: active + k * speculating <= (k + 1) * max_active.
    spec = SpeculationConfig(when="always", tokens=4, max_active=8)  # (4 + 1) * 8 = 40 positions
    assert spec.weight_bound(8, 8) and not spec.weight_bound(9, 9)  # always: at most max_active active
    assert spec.weight_bound(36, 1) and not spec.weight_bound(37, 1)  # one marked straggler among 36
