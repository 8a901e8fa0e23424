"""planner/tools/help.py: --help from the dataclasses' Attributes: docs, fast, without base/* groups."""

import os
import subprocess
import sys
import time
from dataclasses import dataclass, field

import pytest

from planner.tools.help import attributes, class_keys, config_class
from tests.helpers import REPO


@dataclass(frozen=True)
class Inner:
    """A section.

    Attributes:
      rate: the first line,
        continued here.
      size: one line.

    Notes: another section; not a field's doc.
    """

    rate: float = 0.5
    size: int = 1


@dataclass(frozen=True)
class Outer:
    """A config with sections.

    Attributes:
      depth: declared here.
      inner: a section: its keys are listed, not this line.
      spare: a section too, when it may be null.
    """

    depth: int = 2
    inner: Inner = field(default_factory=Inner)
    spare: Inner | None = None


@dataclass(frozen=True, kw_only=True)
class Derived(Outer):
    """A subclass documents only the fields it declares.

    Attributes:
      extra: its own field.
    """

    extra: str = "x"


def test_a_keys_meaning_is_the_attributes_entry_of_the_class_that_declares_it_and_sections_are_flattened():
    keys = {k.name: k.doc for k in class_keys(Derived)}
    assert keys == {
        "depth": "declared here.",
        "inner.rate": "the first line, continued here.",
        "inner.size": "one line.",
        "spare.rate": "the first line, continued here.",
        "spare.size": "one line.",
        "extra": "its own field.",
    }
    assert {k.name: k.doc for k in class_keys("tests.planner.tools.test_help:Derived")} == keys  # imported by name


def test_the_attributes_section_ends_at_the_next_section():
    assert attributes(Inner) == {"rate": "the first line, continued here.", "size": "one line."}
    assert attributes(Derived) == {"extra": "its own field."}  # its own docstring only


@pytest.mark.parametrize("source", ["tests.planner.tools.test_help:Nothing", "tests.planner.tools.test_help:help_of"])
def test_a_name_that_is_no_config_dataclass_is_an_error_naming_it(source):
    with pytest.raises(ValueError, match=source):
        config_class(source)


def help_of(module: str, *args: str) -> tuple[str, float]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    started = time.monotonic()
    p = subprocess.run([sys.executable, "-m", module, *args, "--help"], cwd=REPO, env=env, capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 0 and p.stderr == "", p.stderr
    return p.stdout, time.monotonic() - started


def keys_of(text: str) -> dict[str, str]:
    body = text.split("Keys (KEY=VALUE)", 1)[1].splitlines()[1:]
    return {line.split()[0]: " ".join(line.split()[1:]) for line in body if line.startswith("  ")}


def test_simulate_help_lists_the_groups_with_their_options_and_every_key_with_its_meaning():
    text, _ = help_of("planner.simulate", "policy=areal")
    assert "base/" not in text and "base" not in text.split("Keys")[0].split()
    groups = text.split("Config groups", 1)[1].split("Keys", 1)[0]
    assert "policy       areal* " not in groups and " lookahead* " in groups  # the default, not the choice
    assert "sim          default* fault slot_limited uneven" in groups
    keys = keys_of(text)
    assert keys["sim.trainer.c0"] == "s: fixed cost (optimizer update, publish)"
    assert "policy.max_head_offpolicyness" in keys and "policy.max_untrained_groups" not in keys  # areal's own
    assert keys["max_staleness"] == "η; null = unbounded"  # a top-level key: conf/simulate.yaml's comment
    assert [k for k, doc in keys.items() if not doc] == []
