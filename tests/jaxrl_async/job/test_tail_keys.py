"""A tail key that cannot act in its configuration says so in one start-up line (job/tail_keys.py),
once; a configuration where the key acts says nothing."""

import logging

import pytest

from jaxrl_async.job.setup import typed_config
from jaxrl_async.job.tail_keys import inert_keys
from tests.helpers.controller_harness import ScriptedEngine
from tests.helpers.train_runs import QUIET, compose_train, make_job

MIGRATE = ["policy=lookahead", "policy.migrate=true"]
TWO_REPLICAS = ["engine.replicas=2", "engine.colocate=false"]

INERT = [
    (MIGRATE, "policy.migrate=true has no effect: the run has 1 engine replica, so no straggler can move"),
    (["engine.speculation.when=always", "engine.speculation.max_active=8"],  # the tests' engine.num_slots=32
     "engine.speculation.when=always: speculation runs only while <= engine.speculation.max_active=8 sequences are "
     "active, and engine.num_slots=32 decodes up to 32 at once"),
]

ACTING = [
    [],
    MIGRATE + TWO_REPLICAS,  # the replicas migrate among themselves
    ["engine.speculation.when=critical"],  # the JAX engine speculates the requests the planner marks
    ["engine.speculation.when=always", "engine.speculation.max_active=32"],
]


def start_up_warnings(tmp_path, caplog, overrides) -> list[str]:
    """The job's warnings while it builds every component for `overrides` (the engine included)."""
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="jaxrl_async.job"):
        job = make_job(tmp_path / "run", overrides)
    job.release()
    return [r.getMessage() for r in caplog.records if r.name.startswith("jaxrl_async.job")]


@pytest.mark.slow
@pytest.mark.parametrize("overrides, line", INERT, ids=["one-replica", "max-active"])
def test_a_tail_key_that_cannot_act_is_one_warning_line_at_start_up(tmp_path, caplog, overrides, line):
    warnings = start_up_warnings(tmp_path, caplog, overrides)
    assert len(warnings) == 1 and warnings[0].startswith(line), warnings


@pytest.mark.slow
@pytest.mark.parametrize("overrides", ACTING, ids=["default", "two-replicas", "critical", "max-active-admits"])
def test_a_tail_key_that_acts_gives_no_warning(tmp_path, caplog, overrides):
    assert start_up_warnings(tmp_path, caplog, overrides) == []


def test_an_engine_that_keeps_the_contracts_no_op_migrate_and_mark_critical_is_named_once_for_each_key():
    # ScriptedEngine (a test double) implements neither call, as a cluster's proxy that does not
    # forward them would not: both keys are inert with it, whatever the replicas.
    setup = typed_config(compose_train(QUIET + MIGRATE + TWO_REPLICAS + ["engine.speculation.when=critical"]))
    assert inert_keys(setup, ScriptedEngine()) == [
        "policy.migrate=true has no effect: ScriptedEngine (engine=jax, cluster=local) does not migrate requests",
        "engine.speculation.when=critical has no effect: ScriptedEngine (engine=jax, cluster=local) ignores the "
        "planner's critical marks"]
