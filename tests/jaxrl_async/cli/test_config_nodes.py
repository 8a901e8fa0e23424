"""The training conf/ files start from the dataclasses' defaults and state only what differs.

The defaults live in the dataclasses (jaxrl_async/cli/config_nodes.py stores them as Hydra nodes), so
a YAML file cannot drift from them silently: what it restates at the default value is flagged,
and what it changes is listed here with the reason the file gives. Every key's description is its
dataclass's (tests/jaxrl_async/cli/test_help.py holds `--help` to all of them).
"""

import pytest

from jaxrl_async.cluster.config import CLUSTER_MODES, ClusterConfig, ProcessConfig
from jaxrl_async.cli.config_nodes import config_nodes, register_config_nodes
from jaxrl_async.engines.jax.config import EngineConfig
from jaxrl_async.engines.registry import ENGINES
from jaxrl_async.models.config import ModelSpec
from jaxrl_async.runtime.config import RunConfig
from jaxrl_async.tasks import TASKS
from jaxrl_async.tasks.synthetic import RepeatLetterConfig
from jaxrl_async.job.setup import typed_config
from jaxrl_async.trainer.config import TrainerConfig
from jaxrl_async.trainer.optim import OptimConfig
from planner.configs import build, defaults
from tests.helpers.conf_files import CONF, composed, extends, options, restated_defaults
from tests.helpers.train_runs import compose_train

register_config_nodes()

# group -> option -> the dataclass that types it
TYPED = {
    "engine": {name: entry.config for name, entry in ENGINES.items()},
    "trainer": {name: TrainerConfig for name in options("trainer")},
    "cluster": {name: mode.config for name, mode in CLUSTER_MODES.items()},
    "task": {name: task.config_class for name, task in TASKS.items()},
}
OPTIONS = [(group, option) for group in TYPED for option in options(group)]
# Keys a user must give before the config is valid (task=custom has no prompts of its own).
USER_INPUT = {("task", "custom"): {"path": "prompts.jsonl"},
              ("task", "verifiers"): {"env": "guess_digit"}}


def test_the_default_command_line_builds_the_dataclass_defaults_but_the_embedded_runs_overrides():
    setup = typed_config(compose_train([]))
    # conf/train.yaml: the demo's length and the tiny model's learning-rate schedule.
    assert setup.run == RunConfig(steps=250, max_new_tokens=8)
    assert setup.trainer == TrainerConfig(optim=OptimConfig(lr=5e-3, total_steps=250, min_lr_ratio=0.3))
    # conf/engine/jax.yaml: one step's batch decodes at once, in a KV cache sized for the demo.
    assert setup.engine_name == "jax" and setup.engine == EngineConfig(num_slots=64, max_len=128)
    assert setup.cluster == ClusterConfig("local", ProcessConfig())
    assert setup.model == ModelSpec("tiny", "float32")
    assert build(RepeatLetterConfig, {k: v for k, v in setup.task.items() if k != "name"}, "task") == \
        RepeatLetterConfig()


def test_every_group_file_is_one_of_the_options_the_code_types():
    assert [(g, o) for g, o in OPTIONS if o not in TYPED[g]] == []
    assert [(g, o) for g in TYPED for o in TYPED[g] if not (CONF / g / f"{o}.yaml").exists()] == []


@pytest.mark.parametrize(("group", "option"), OPTIONS)
def test_a_group_file_states_only_what_differs_from_the_dataclass(group, option):
    assert restated_defaults(group, option, TYPED[group][option]) == []


@pytest.mark.parametrize(("group", "option"), OPTIONS)
def test_a_group_file_composes_to_a_valid_config_with_every_key(group, option):
    values = composed(group, option)
    values.pop("name", None)
    cls = TYPED[group][option]
    assert set(values) == set(defaults(cls))  # every key exists, so every key takes a command-line override
    assert build(cls, {**values, **USER_INPUT.get((group, option), {})}, group) is not None


@pytest.mark.parametrize(("group", "option"), OPTIONS)
def test_a_group_file_starts_from_its_defaults_node_or_from_a_sibling_that_does(group, option):
    """Its keys are the dataclass's, which `--help` describes (tests/jaxrl_async/cli/test_help.py)."""
    (first, *_) = extends(group, option)
    if first not in (f"/base/{group}/{option}@_here_", f"/base/{group}@_here_"):  # a variant of a sibling
        assert first in options(group) and extends(group, first)[0].startswith(f"/base/{group}")


def test_the_trainer_variants_start_from_grpo_which_is_the_dataclass_defaults():
    assert build(TrainerConfig, composed("trainer", "grpo"), "trainer") == TrainerConfig()


def test_every_typed_option_has_a_defaults_node():
    nodes = config_nodes()
    assert {f"{g}/{o}" for g, o in OPTIONS if g != "trainer"} <= set(nodes)
    assert nodes["train"] is RunConfig and nodes["trainer"] is TrainerConfig


@pytest.mark.parametrize("experiment", options("experiment"))
def test_every_experiment_composes_into_a_valid_training_config(experiment):
    setup = typed_config(compose_train([f"+experiment={experiment}"]))
    assert setup.model.source == "smollm2_135m" and setup.task["name"] in ("arithmetic", "calculator")
    assert setup.run.eval.every > 0  # a recipe is measured on its held-out split while it trains


def test_the_harder_recipe_changes_only_the_task_of_the_one_it_extends():
    easy, hard = (typed_config(compose_train([f"+experiment={e}"])) for e in ("smollm2_arithmetic", "smollm2_products12"))
    assert easy.run == hard.run and easy.trainer == hard.trainer and easy.engine == hard.engine
    assert (easy.task["max_operand"], hard.task["max_operand"]) == (9, 12)


def test_the_help_reads_the_same_dataclasses_as_the_config_nodes():
    from jaxrl_async.cli.help import HELP_NODES
    from jaxrl_async.cli.eval import EvalConfig
    from jaxrl_async.cli.generate import GenerateConfig
    from jaxrl_async.cli.serve import ServeConfig

    # the one-shot commands register their own top level (cli/common.py run_command)
    nodes = {**config_nodes(), "generate": GenerateConfig, "eval": EvalConfig, "serve": ServeConfig}
    assert HELP_NODES == {path: f"{cls.__module__}:{cls.__qualname__}" for path, cls in nodes.items()}
