"""The task contract: the registry, config checks and the conf/task files."""

import dataclasses

import pytest

from jaxrl_async.tasks import TASKS, Task, TaskConfig, build_task, register_task
from tests.helpers.docstrings import undocumented_fields


def test_every_conf_task_yaml_builds_its_registered_task():
    from jaxrl_async.cli.config_nodes import register_config_nodes
    from tests.helpers.conf_files import composed, options

    register_config_nodes()  # each task file starts from its config's defaults node
    names = set(options("task"))
    assert names == set(TASKS)
    for name in names - {"custom", "verifiers"}:  # custom needs a path (test_custom.py), verifiers an env
        cfg = composed("task", name)
        assert cfg["name"] == name and type(build_task(cfg)) is TASKS[name]


def test_an_unknown_key_a_wrong_type_or_an_unknown_task_is_a_one_line_error_naming_it():
    with pytest.raises(ValueError, match=r"task.alphabett: unknown key for task 'repeat_letter'"):
        build_task({"name": "repeat_letter", "alphabett": "ab"})
    with pytest.raises(ValueError, match=r"task.num_prompts='8': must be an integer"):
        build_task({"name": "repeat_letter", "num_prompts": "8"})
    with pytest.raises(ValueError, match=r"task.max_len=1: must be >= min_len=2"):
        build_task({"name": "copy_string", "max_len": 1})
    with pytest.raises(ValueError, match=r"task.name='nope': not a registered task"):
        build_task({"name": "nope"})


def test_registering_a_second_task_under_a_taken_name_raises():
    class Again(Task):
        name = "repeat_letter"
        config_class = TaskConfig

    with pytest.raises(ValueError, match="registered twice"):
        register_task(Again)


def test_task_configs_are_frozen():
    task = build_task({"name": "repeat_letter"})
    with pytest.raises(dataclasses.FrozenInstanceError):
        task.cfg.alphabet = "xyz"


@pytest.mark.parametrize("rate", [-0.1, 1.5])
def test_a_failure_rate_outside_0_1_is_a_one_line_error_naming_the_key(rate):
    with pytest.raises(ValueError, match=r"task.max_reward_failure_rate=.*: must be in \[0, 1\]") as info:
        build_task({"name": "repeat_letter", "max_reward_failure_rate": rate})
    assert "\n" not in str(info.value)
    assert build_task({"name": "repeat_letter", "max_reward_failure_rate": 1}).cfg.max_reward_failure_rate == 1
    assert build_task({"name": "repeat_letter"}).cfg.max_reward_failure_rate == 0.5


def test_an_old_config_with_the_removed_hung_cap_gets_unknown_key():
    with pytest.raises(ValueError, match=r"^task\.reward_max_hung: unknown key for task 'repeat_letter' \(known: "):
        build_task({"name": "repeat_letter", "reward_max_hung": 32})


@pytest.mark.parametrize(("key", "value", "message"), [
    ("reward_timeout_s", "30", "task.reward_timeout_s='30': must be a number"),
    ("reward_workers", True, "task.reward_workers=True: must be an integer"),
    ("reward_fn", 3, "task.reward_fn=3: must be a string, or null"),
    ("lengths", None, "task.lengths=null: must be a string (leave it ??? for its default)"),
])
def test_a_shared_task_key_of_the_wrong_type_is_refused_by_the_one_builder_naming_the_key(key, value, message):
    with pytest.raises(ValueError) as info:
        build_task({"name": "copy_string", key: value})
    assert str(info.value) == message


def test_every_shared_task_key_is_documented_in_the_attributes_section():
    assert undocumented_fields(TaskConfig) == []
