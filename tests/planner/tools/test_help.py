"""planner/tools/help.py: --help from the dataclasses' field comments, fast, without base/* groups."""

import os
import subprocess
import sys
import time
from dataclasses import dataclass, field

from planner.tools.help import class_keys
from tests.helpers import REPO


@dataclass(frozen=True)
class Inner:
    """A section.

    Attributes:
      rate: from the docstring, when the field has no comment;
        continued here.
    """

    rate: float = 0.5
    size: int = 1  # from the comment


@dataclass(frozen=True)
class Outer:
    # from the lines above,
    # both of them
    depth: int = 2
    inner: Inner = field(default_factory=Inner)  # a section: its keys are listed, not this line
    spare: Inner | None = None


def test_a_keys_meaning_is_its_fields_comment_or_docstring_entry_and_sections_are_flattened():
    keys = {k.name: k.doc for k in class_keys(Outer)}
    assert keys == {
        "depth": "from the lines above, both of them",
        "inner.rate": "from the docstring, when the field has no comment; continued here.",
        "inner.size": "from the comment",
        "spare.rate": "from the docstring, when the field has no comment; continued here.",
        "spare.size": "from the comment",
    }
    assert {k.name: k.doc for k in class_keys("tests.planner.tools.test_help:Outer")} == keys  # from source alone


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
