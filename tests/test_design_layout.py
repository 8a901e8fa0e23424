"""docs/design.md §6 is the repository's tree: every module of `planner/` and `jaxrl_async/` (but
`__init__.py`) and every file of `docs/` is named there, under its own folder, and nothing that
does not exist is. The tree is read as written: a line whose first word ends in `/` opens a
folder at its indentation (nested under the nearest shallower one); the file names on it and on
the lines that continue it belong to that folder."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHECKED = ("planner/", "jaxrl_async/", "docs/")
FILE = re.compile(r"\b[A-Za-z_][\w]*\.(?:py|md)\b")


def layout_section(design: str) -> list[str]:
    start = design.index("## 6. Layout")
    end = design.index("\n## ", start + 1)
    return [line for line in design[start:end].splitlines() if line.startswith("    ")]


def files_in_tree(lines: list[str]) -> set[str]:
    """The paths the tree names, e.g. `planner/tools/audit.py`."""
    stack: list[tuple[int, str]] = []  # (indentation, folder path) of the open folders
    named: set[str] = set()
    for line in lines:
        text = line.lstrip()
        indent = len(line) - len(text)
        first = text.split(" ", 1)[0]
        if first.endswith("/") and indent < 20:  # a folder line (continuations start at column 20)
            while stack and stack[-1][0] >= indent:
                stack.pop()
            stack.append((indent, (stack[-1][1] if stack else "") + first))
            text = text[len(first):]
        if not stack:
            continue
        folder = stack[-1][1]
        named.update(folder + name for name in FILE.findall(text))
    return named


def files_in_repository() -> set[str]:
    listed = subprocess.run(["git", "ls-files", *CHECKED], cwd=ROOT, capture_output=True, text=True, check=True)
    files = {path for path in listed.stdout.split() if (ROOT / path).exists()}
    return {p for p in files if (p.endswith(".py") and not p.endswith("__init__.py")) or
            (p.startswith("docs/") and p.endswith(".md"))}


def test_the_design_layout_names_every_module_and_document_under_its_folder():
    named = {p for p in files_in_tree(layout_section((ROOT / "docs/design.md").read_text())) if p.startswith(CHECKED)}
    actual = files_in_repository()
    assert len(actual) > 100  # the case is not trivial: the whole package is compared
    assert sorted(actual - named) == [], "modules missing from docs/design.md §6"
    assert sorted(named - actual) == [], "docs/design.md §6 names files that do not exist"


def test_the_tree_reader_places_a_file_under_its_nested_folder():
    lines = ["    planner/        base.py (contract),",
             "                    types.py",
             "      tools/        audit.py, entry.py",
             "    jaxrl_async/    trees.py",
             "        jax/        core.py"]
    assert files_in_tree(lines) == {"planner/base.py", "planner/types.py", "planner/tools/audit.py",
                                    "planner/tools/entry.py", "jaxrl_async/trees.py", "jaxrl_async/jax/core.py"}
