"""The speculator (speculator.py): which samples draft, in which regime, and the counts it reports."""

import pytest

from jaxrl_async.engines.base import GenerationRequest
from jaxrl_async.engines.speculation import SpeculationConfig
from tests.jaxrl_async.engines.jax.test_core import greedy_reference, peaked_model, run
from tests.jaxrl_async.engines.jax.test_speculative import REPEATING, greedy, make_core


@pytest.fixture(scope="module")
def peaked():
    return peaked_model()


def self_draft(when: str, max_active: int) -> SpeculationConfig:
    return SpeculationConfig(when=when, method="draft", draft_model="layers:1", tokens=4, max_active=max_active)


def test_speculating_counts_the_samples_that_drafted_in_each_call(peaked):
    core = make_core(peaked, self_draft("critical", 4), decode_steps_per_call=1)  # one verify pass a call
    for rid in "abc":
        core.submit(GenerationRequest(rid, REPEATING, greedy(24)))
    core.step()
    assert core.counters["speculating"] == core.counters["drafted"] == 0  # nobody marked
    core.mark_critical("a")
    core.mark_critical("c")
    core.step()
    assert core.counters["speculating"] == 2 and core.counters["drafted"] == 2 * 4


def test_a_marked_straggler_speculates_in_a_step_too_crowded_for_all_to(peaked):
    # max_active 2, k 4: 10 query positions. Four samples all drafting need 4 + 4 * 4 = 20 (plain);
    # four with one drafting need 4 + 4 = 8 (speculates): the simulator's rule, planner/sim/config.py.
    for when, marked in (("always", 0), ("critical", 1)):
        core = make_core(peaked, self_draft(when, 2), decode_steps_per_call=1)
        for rid in "abcd":
            core.submit(GenerationRequest(rid, REPEATING, greedy(12)))
        core.mark_critical("b")
        core.step()
        assert core.active_slots == 4 and core.counters["speculating"] == marked, when
        out = run(core)
        assert out[("b", 0)].token_ids == greedy_reference(peaked, REPEATING, 12)
