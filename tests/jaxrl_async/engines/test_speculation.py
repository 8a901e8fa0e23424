"""`engine.speculation.*`: the keys both engines read, and their one-line errors."""

import pytest

from jaxrl_async.engines.speculation import SpeculationConfig


def test_speculation_is_off_by_default_so_every_existing_figure_stays_as_it_is():
    assert not SpeculationConfig().enabled
    assert SpeculationConfig(when="critical").enabled and SpeculationConfig(when="always").enabled


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"when": "sometimes"}, r"engine.speculation.when='sometimes': must be one of never, critical, always"),
    ({"method": "eagle"}, r"engine.speculation.method='eagle': must be one of ngram, draft"),
    ({"tokens": 0}, r"engine.speculation.tokens=0: must be an int >= 1"),
    ({"tokens": True}, r"engine.speculation.tokens=True: must be an int >= 1"),
    ({"max_active": 0}, r"engine.speculation.max_active=0"),
    ({"method": "draft"}, r"engine.speculation.draft_model=None: must be set when engine.speculation.method=draft"),
])
def test_a_bad_speculation_key_is_a_one_line_error_naming_it(kwargs, message):
    with pytest.raises(ValueError, match=message) as info:
        SpeculationConfig(**kwargs)
    assert "\n" not in str(info.value)
