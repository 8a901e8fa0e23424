"""`check_start`: a typed run checked against its data, model and devices, and `TrainJob` doing it
before the run directory exists (a library user's job leaves nothing behind either)."""

from __future__ import annotations

import pytest

from jaxrl_async.job.preflight import check_start
from jaxrl_async.job.setup import typed_config
from tests.helpers.train_runs import QUIET, compose_train, make_job

SMALL = ["steps=1", "batch_groups=2", "group_size=2", "max_new_tokens=4"]
DRAFT = ["engine.speculation.when=always", "engine.speculation.method=draft"]


def setup(*overrides: str):
    return typed_config(compose_train([*QUIET, *SMALL, *overrides]))


def test_the_default_run_passes_with_and_without_the_devices():
    check_start(setup(), devices=True)
    check_start(setup(), devices=False)


def test_the_task_section_is_typed_with_the_others():
    with pytest.raises(ValueError, match=r"^task.path=None: task 'custom' needs a JSONL file"):
        setup("task=custom")


@pytest.mark.parametrize("overrides, message", [
    (["task=custom", "task.path=/no/such.jsonl"], r"^task.path='/no/such.jsonl': no such file"),
    (["eval.every=1", "task=gsm8k"], r"^task.test_path=None: "),
    (["model.source=/no/such/model"], r"^model.source='/no/such/model': neither a registered name"),
    ([*DRAFT, "engine.speculation.draft_model=layers:2"], r"^engine.speculation.draft_model='layers:2': N must be "
                                                          r"in \[1, 1\] \(the policy has 2 layers\)"),
    (["trainer.lora.rank=40", "trainer.lora.targets=[k_proj]"], r"^trainer.lora.rank=40: larger than k_proj's "
                                                                 r"smaller dimension \(32\); use a rank <= 32$"),
    (["model.adapter=/no/such/adapter"], r"^model.adapter='/no/such/adapter': not a PEFT adapter directory"),
])
def test_what_a_key_names_is_checked_before_anything_is_written(overrides, message):
    with pytest.raises(ValueError, match=message):
        check_start(setup(*overrides), devices=False)


def test_a_draft_within_the_policys_layers_passes():
    check_start(setup(*DRAFT, "engine.speculation.draft_model=layers:1"), devices=False)


def test_the_devices_are_checked_only_when_asked():
    many = setup("engine.replicas=64")
    check_start(many, devices=False)  # a multi-host job before it joins: TrainJob checks them later
    with pytest.raises(ValueError, match=r"^engine.replicas=64 x engine.tensor_parallel=1 needs 64 devices"):
        check_start(many, devices=True)


@pytest.mark.parametrize("overrides", [["engine.replicas=64"], ["task=custom", "task.path=/no/such.jsonl"]])
def test_a_job_refused_at_start_makes_no_run_directory(tmp_path, overrides):
    with pytest.raises(ValueError):
        make_job(tmp_path / "run", [*SMALL, *overrides])
    assert not (tmp_path / "run").exists()
