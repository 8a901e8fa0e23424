"""The task contract: the registry, config checks and the conf/task files."""

import dataclasses

import pytest

from jaxrl_async.tasks import TASKS, Task, TaskConfig, build_task, register_task


def test_every_conf_task_yaml_builds_its_registered_task():
    from jaxrl_async.cli.config_nodes import register_config_nodes
    from tests.helpers.conf_files import composed, options

    register_config_nodes()  # each task file starts from its config's defaults node
    names = set(options("task"))
    assert names == set(TASKS)
    for name in names - {"custom"}:  # custom needs a path: test_custom.py
        cfg = composed("task", name)
        assert cfg["name"] == name and type(build_task(cfg)) is TASKS[name]


def test_an_unknown_key_a_wrong_type_or_an_unknown_task_is_a_one_line_error_naming_it():
    with pytest.raises(ValueError, match=r"task.alphabett: unknown key for task 'repeat_letter'"):
        build_task({"name": "repeat_letter", "alphabett": "ab"})
    with pytest.raises(ValueError, match=r"task.num_prompts='8': must be int"):
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
