"""A tail key that cannot act in its configuration says so in one start-up line (job/tail_keys.py),
once; a configuration where the key acts says nothing."""

import logging

import pytest

from tests.helpers.train_runs import make_job

pytestmark = pytest.mark.slow

MIGRATE = ["policy=lookahead", "policy.migrate=true"]
RAY = ["cluster=ray", "cluster.num_workers=2"]

INERT = [
    (MIGRATE, "policy.migrate=true has no effect: the run has 1 engine replica"),
    (MIGRATE + RAY, "policy.migrate=true has no effect: RayEngineProxy (engine=jax, cluster=ray) does not migrate"),
    (["engine.speculation.when=critical"] + RAY,
     "engine.speculation.when=critical has no effect: RayEngineProxy (engine=jax, cluster=ray) ignores the "
     "planner's critical marks"),
    (["engine.speculation.when=always", "engine.speculation.max_active=8"],  # the tests' engine.num_slots=32
     "engine.speculation.when=always: speculation runs only while <= engine.speculation.max_active=8 sequences are "
     "active, and engine.num_slots=32 decodes up to 32 at once"),
]

ACTING = [
    [],
    MIGRATE + ["engine.replicas=2", "engine.colocate=false"],
    ["engine.speculation.when=critical"],  # the JAX engine speculates the requests the planner marks
    ["engine.speculation.when=always", "engine.speculation.max_active=32"],
]


def start_up_warnings(tmp_path, caplog, overrides) -> list[str]:
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="jaxrl_async.job"):
        job = make_job(tmp_path / "run", overrides)
    job.release()
    return [r.getMessage() for r in caplog.records if r.name.startswith("jaxrl_async.job")]


@pytest.mark.parametrize("overrides, line", INERT, ids=["one-replica", "ray-migrate", "ray-critical", "max-active"])
def test_a_tail_key_that_cannot_act_is_one_warning_line_at_start_up(tmp_path, caplog, overrides, line):
    warnings = start_up_warnings(tmp_path, caplog, overrides)
    assert len(warnings) == 1 and warnings[0].startswith(line), warnings


@pytest.mark.parametrize("overrides", ACTING, ids=["default", "two-replicas", "critical", "max-active-admits"])
def test_a_tail_key_that_acts_gives_no_warning(tmp_path, caplog, overrides):
    assert start_up_warnings(tmp_path, caplog, overrides) == []
