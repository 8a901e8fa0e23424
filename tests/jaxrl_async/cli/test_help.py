"""`--help` of every command lists every key its config holds, each with a one-line description.

The walk covers every command on conf/ (train, eval, generate, serve, simulate, tune) with its defaults
and with each option of each of its groups (conf/<group>/*.yaml), composes that command line as
Hydra does, and holds the composed leaf keys equal to the keys `--help` lists; the descriptions
are the dataclasses' `Attributes:` entries (planner/tools/help.py), and an entry that names no
field of its class is a stale doc.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from typing import Any

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from jaxrl_async.cli.config_nodes import register_config_nodes
from jaxrl_async.cli.eval import EvalConfig
from jaxrl_async.cli.generate import GenerateConfig
from jaxrl_async.cli.serve import ServeConfig
from jaxrl_async.cli.help import help_spec
from planner.configs import register_defaults
from planner.tools import simulate, tune
from planner.tools.help import HelpSpec, attributes, config_classes, listing, options
from tests.helpers import CONF, REPO


def spec(command: str) -> HelpSpec:
    """The HelpSpec each command's `--help` uses (prog and summary aside)."""
    if command == "train":
        return help_spec(command, "")
    if command in ("eval", "generate", "serve"):  # cli/common.py run_command: no experiments
        return dataclasses.replace(help_spec(command, ""), extra_groups=())
    return simulate.help_spec(command, "", {"tune": tune.TuneConfig} if command == "tune" else None)


def register(command: str) -> None:
    if command in ("train", "eval", "generate", "serve"):
        register_config_nodes({"eval": EvalConfig, "generate": GenerateConfig, "serve": ServeConfig})
    else:
        simulate.register_config_nodes()
        register_defaults({"tune": tune.TuneConfig})


def composed(command: str, argv: list[str]) -> dict[str, Any]:
    register(command)
    with initialize_config_dir(str(CONF), version_base="1.3"):
        cfg = compose(command, overrides=argv)
    return OmegaConf.to_container(cfg, resolve=False)


def leaf_keys(values: Any, prefix: str = "") -> list[str]:
    if not isinstance(values, dict) or not values:
        return [prefix.rstrip(".")]
    return [k for key, value in values.items() for k in leaf_keys(value, f"{prefix}{key}.")]


def command_lines() -> list[tuple[str, list[str]]]:
    """Every command with its defaults and with each option of each of its groups."""
    out = []
    for command in ("train", "eval", "generate", "serve", "simulate", "tune"):
        out.append((command, []))
        groups = listing(CONF, command, spec(command)).groups
        for group in [*groups, *(g for g in spec(command).extra_groups if g not in groups)]:
            plus = "" if group in groups else "+"
            out += [(command, [f"{plus}{group}={option}"]) for option in options(CONF, group)]
    return out


COMMAND_LINES = command_lines()


@pytest.mark.parametrize(("command", "argv"), COMMAND_LINES, ids=[" ".join([c, *a]) for c, a in COMMAND_LINES])
def test_help_lists_every_key_of_the_composed_config_with_a_description(command, argv):
    found = listing(CONF, command, spec(command), argv)
    groups = {*found.groups, *found.picked}
    values = composed(command, argv)
    values.pop("hydra", None)
    keys = [k for k in leaf_keys(values) if k.partition(".")[0] not in groups or k.partition(".")[2] != "name"]
    assert [k for k in keys if k not in found.keys] == []  # a key the command takes but --help misses
    assert [k for k in found.keys if k not in keys] == []  # a key --help lists but the command refuses
    assert {k: found.keys[k].type for k in keys if not found.keys[k].doc} == {}  # no description


def every_config_class() -> list[type]:
    seen: list[type] = []
    for command, argv in COMMAND_LINES:
        for _, source in listing(CONF, command, spec(command), argv).sections:
            for cls in config_classes(source):
                seen += [c for c in cls.__mro__ if dataclasses.is_dataclass(c) and c not in seen]
    return seen


@pytest.mark.parametrize("cls", every_config_class(), ids=lambda cls: cls.__qualname__)
def test_every_attributes_entry_names_a_field_of_its_class(cls):
    fields = {f.name for f in dataclasses.fields(cls)}
    assert [name for name in attributes(cls) if name not in fields] == []


# The command's module -> the first words of the summary its --help opens with.
SUMMARIES = {"jaxrl_async.train": "one async RL run", "jaxrl_async.eval": "score a model on a task's held-out split",
             "jaxrl_async.generate": "complete one prompt", "jaxrl_async.serve": "serve a model over HTTP",
             "planner.simulate": "run one policy on the simulated cluster", "planner.tune": "search"}


@pytest.mark.parametrize("module", SUMMARIES)
def test_help_opens_with_the_commands_summary_and_imports_no_jax(module):
    code = (f"import runpy, sys\nsys.argv = ['{module}', '--help']\ntry:\n    runpy.run_module('{module}', "
            "run_name='__main__')\nexcept SystemExit as e:\n    assert not e.code, e.code\n"
            "print(sorted(m for m in ('jax', 'flax', 'optax', 'grain') if m in sys.modules), file=sys.stderr)")
    p = subprocess.run([sys.executable, "-c", code], cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
                       capture_output=True, text=True, timeout=60)
    assert p.stderr.strip() == "[]"  # what --help imported of the heavy packages (JAX: seconds)
    usage, summary = p.stdout.splitlines()[:2]
    assert usage.startswith(f"python -m {module} ") and summary.strip().startswith(SUMMARIES[module]), summary


def test_every_config_class_the_help_can_reach_imports_no_backend():
    """In a fresh interpreter: each "module:QualName" of jaxrl_async/cli/help.py, whatever group
    option the command line picks (engine=vllm, cluster=ray, task=gsm8k ...)."""
    code = ("import sys\nfrom jaxrl_async.cli.help import HELP_NODES, MODEL_SPEC\n"
            "from planner.tools.help import config_class\n"
            "for source in [*HELP_NODES.values(), MODEL_SPEC]:\n    config_class(source)\n"
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'jax', 'flax', 'optax', 'grain', 'ray', 'vllm', "
            "'torch', 'sympy', 'reasoning_gym'}))")
    p = subprocess.run([sys.executable, "-c", code], cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
                       capture_output=True, text=True, timeout=60)
    assert p.stdout.strip() == "[]", p.stdout + p.stderr
