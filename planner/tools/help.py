"""`--help` for a Hydra command, derived from its config dataclasses without importing them.

The one source of a key's meaning is its dataclass field: the comment at the end of the field's
line, or else the comment lines right above it (`planner/sim/config.py` and
`jaxrl_async/runtime/config.py` show the convention), or else the field's entry in the class
docstring's `Attributes:` section (`jaxrl_async/engines/jax/core.py EngineConfig`). The help reads those comments from the
source files with `ast` and `tokenize` instead of importing the classes, because the training
side's config modules import JAX (seconds) and `--help` must answer at once; a class given as a
class is read from its own source file the same way.

What the help lists follows the command's `conf/` file as Hydra would compose it: its defaults
list names the `base/<path>` nodes (each a dataclass, `planner/configs.py register_defaults`) and
the groups; the option of a group is the command line's `group=option`, else the default, so
`policy=areal --help` shows areal's native parameters. `base/*` groups are internal and never
listed. A top-level key that no dataclass holds (`planner.simulate`'s) is described by its comment
in the command's own YAML file.
"""

from __future__ import annotations

import ast
import functools
import inspect
import io
import re
import sys
import textwrap
import tokenize
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml

# A dataclass for the help: the class itself (cheap to import) or "module:QualName" (read from
# source only, for classes whose module imports JAX).
Source = type | str
DOC_WIDTH = 96


@dataclass(frozen=True)
class Key:
    name: str  # dotted, as the command line takes it
    type: str  # the annotation as written
    doc: str  # one line


@dataclass(frozen=True)
class HelpSpec:
    """What a command's help needs besides its `conf/` files."""

    prog: str  # "python -m planner.simulate"
    summary: str  # one line: what the command does
    nodes: Mapping[str, Source]  # base node path ("sim", "workload/lognormal") -> its dataclass
    # A group whose options are no base node: group -> (option -> its dataclass or None).
    option_classes: Mapping[str, Callable[[str], Source | None]] = ()
    extra_groups: Sequence[str] = ()  # groups added with +group=option (not in the defaults list)
    hydra_flags: bool = True  # an @hydra.main command (--cfg job, -m); false for the Compose API ones


def _module_file(module: str) -> Path:
    parts = module.split(".")
    for root in sys.path or ["."]:
        base = Path(root or ".").joinpath(*parts)
        for path in (base.with_suffix(".py"), base / "__init__.py"):
            if path.is_file():
                return path
    raise ValueError(f"help: module {module} not found")


@functools.lru_cache(maxsize=None)
def _parsed(path: Path) -> tuple[ast.Module, dict[int, tuple[bool, str]]]:
    """The module's syntax tree and its comments: line -> (the line holds only the comment, text)."""
    text = path.read_text(encoding="utf-8")
    comments = {}
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type == tokenize.COMMENT:
            comments[tok.start[0]] = (tok.line.lstrip().startswith("#"), tok.string.lstrip("#").strip())
    return ast.parse(text), comments


def _locate(source: Source) -> tuple[Path, str, str]:
    """(source file, module name, qualified class name)."""
    if isinstance(source, str):
        module, _, qualname = source.partition(":")
        return _module_file(module), module, qualname
    return Path(inspect.getsourcefile(source)), source.__module__, source.__qualname__


def _class(tree: ast.Module, qualname: str) -> ast.ClassDef | None:
    body: list[ast.stmt] = tree.body
    node = None
    for part in qualname.split("."):
        node = next((n for n in body if isinstance(n, ast.ClassDef) and n.name == part), None)
        if node is None:
            return None
        body = node.body
    return node


def _is_dataclass(node: ast.ClassDef) -> bool:
    for d in node.decorator_list:
        target = d.func if isinstance(d, ast.Call) else d
        if (isinstance(target, ast.Name) and target.id == "dataclass") or \
                (isinstance(target, ast.Attribute) and target.attr == "dataclass"):
            return True
    return False


def _resolve(tree: ast.Module, path: Path, module: str, name: str) -> tuple[Path, str, str] | None:
    """Where the class `name` used in `module` (file `path`) is defined: there, or where it is imported from."""
    if _class(tree, name) is not None:
        return path, module, name
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                if (alias.asname or alias.name) == name:
                    try:
                        return _module_file(node.module), node.module, alias.name
                    except ValueError:
                        return None
    return None


def _doc(node: ast.AnnAssign, comments: Mapping[int, tuple[bool, str]]) -> str:
    """The field's comment: at the end of its line(s), else the comment-only lines right above."""
    for line in range(node.end_lineno, node.lineno - 1, -1):
        if line in comments and not comments[line][0]:
            return comments[line][1]
    above, line = [], node.lineno - 1
    while line in comments and comments[line][0]:
        above.insert(0, comments[line][1])
        line -= 1
    return " ".join(above)


def _attributes(node: ast.ClassDef) -> dict[str, str]:
    """The `Attributes:` section of a class docstring (Google style) -> field name -> text."""
    doc = ast.get_docstring(node) or ""
    out, current, indent = {}, None, None
    lines = doc.split("Attributes:", 1)[1].splitlines() if "Attributes:" in doc else []
    for line in lines[1:]:
        if not line.strip():
            if out:
                break
            continue
        depth = len(line) - len(line.lstrip())
        m = re.match(r"\s*(\w+):\s*(.*)$", line)
        if m and (indent is None or depth == indent):
            indent, current = depth, m.group(1)
            out[current] = m.group(2)
        elif current is not None and indent is not None and depth > indent:
            out[current] += " " + line.strip()
        else:
            break
    return out


def _one_line(doc: str) -> str:
    doc = " ".join(doc.split())
    return doc if len(doc) <= DOC_WIDTH else textwrap.shorten(doc, DOC_WIDTH, placeholder=" …")


def _nested_name(annotation: ast.expr) -> str | None:
    """`X`, `X | None` or `Optional[X]` -> "X" (a possible nested config); else None."""
    if isinstance(annotation, ast.Name):
        return annotation.id
    if isinstance(annotation, ast.BinOp) and isinstance(annotation.op, ast.BitOr):
        names = [n for n in (annotation.left, annotation.right) if not (isinstance(n, ast.Constant) and n.value is None)]
        return _nested_name(names[0]) if len(names) == 1 else None
    return None


def _fields(path: Path, module: str, qualname: str, prefix: str) -> list[Key]:
    tree, comments = _parsed(path)
    node = _class(tree, qualname)
    if node is None:
        raise ValueError(f"help: class {qualname} not found in {path}")
    out, attributes = [], _attributes(node)
    for stmt in node.body:
        if not (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)):
            continue
        annotation = ast.unparse(stmt.annotation)
        if annotation.startswith(("ClassVar", "typing.ClassVar")):
            continue
        key = f"{prefix}{stmt.target.id}"
        name = _nested_name(stmt.annotation)
        where = _resolve(tree, path, module, name) if name else None
        if where is not None:
            sub_tree, _ = _parsed(where[0])
            sub = _class(sub_tree, where[2])
            if sub is not None and _is_dataclass(sub):
                out.extend(_fields(*where, f"{key}."))
                continue
        doc = _doc(stmt, comments) or attributes.get(stmt.target.id, "")
        out.append(Key(key, annotation, _one_line(doc)))
    return out


def class_keys(source: Source, prefix: str = "") -> list[Key]:
    """Every leaf key of a config dataclass (nested sections flattened), with its field comment."""
    return _fields(*_locate(source), prefix)


def _yaml(conf_dir: Path, name: str) -> dict:
    path = conf_dir / f"{name}.yaml"
    return (yaml.safe_load(path.read_text(encoding="utf-8")) or {}) if path.is_file() else {}


def _yaml_comments(path: Path) -> dict[str, str]:
    """Top-level `key: value  # comment` lines of a YAML file -> comment."""
    out = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        m = re.match(r"^([A-Za-z_]\w*):[^#]*#\s*(.*)$", line)
        if m:
            out[m.group(1)] = m.group(2)
    return out


def choices(argv: Sequence[str]) -> dict[str, str]:
    """`group=option` pairs of a command line (also `+group=option`); a dotted key is no group."""
    out = {}
    for arg in argv:
        key, sep, value = arg.lstrip("+").partition("=")
        if sep and "." not in key and "," not in value:
            out[key] = value
    return out


def options(conf_dir: Path, group: str) -> list[str]:
    return sorted(p.stem for p in (conf_dir / group).glob("*.yaml"))


def _walk(conf_dir: Path, spec: HelpSpec, name: str, prefix: str, picked: Mapping[str, str],
          sections: list[tuple[str, Source]], groups: dict[str, str], tops: list[str]) -> None:
    """Follow a config file's defaults list: base nodes -> `sections`, groups -> `groups`, the
    top-level config files included -> `tops`."""
    group_dir = name.rpartition("/")[0]
    for entry in _yaml(conf_dir, name).get("defaults", []):
        if isinstance(entry, str):
            if entry == "_self_":
                continue
            m = re.fullmatch(r"/?base/(.+?)(@_here_)?", entry)
            if m:
                if m.group(1) in spec.nodes:
                    sections.append((prefix, spec.nodes[m.group(1)]))
            else:  # another config file: a sibling in the group or a top-level config
                if not group_dir:
                    tops.append(entry)
                _walk(conf_dir, spec, f"{group_dir}/{entry}" if group_dir else entry, prefix, picked, sections, groups,
                      tops)
        elif isinstance(entry, dict):
            for group, default in entry.items():
                group = group.removeprefix("override ").lstrip("/")
                if group.startswith("hydra"):
                    continue
                option = picked.get(group, default)
                groups.setdefault(group, default)
                if option is None or option not in options(conf_dir, group):
                    continue
                if group in dict(spec.option_classes):
                    cls = dict(spec.option_classes)[group](option)
                    if cls is not None:
                        sections.append((f"{group}.", cls))
                _walk(conf_dir, spec, f"{group}/{option}", f"{group}.", picked, sections, groups, tops)


def help_text(conf_dir: Path, config_name: str, spec: HelpSpec, argv: Sequence[str] = ()) -> str:
    """The command's help: usage, its config groups and options, and every key with its meaning."""
    picked = choices(argv)
    sections: list[tuple[str, Source]] = []
    groups: dict[str, str] = {}
    tops = [config_name]
    _walk(conf_dir, spec, config_name, "", picked, sections, groups, tops)
    keys: dict[str, Key] = {}
    for prefix, source in sections:
        for key in class_keys(source, prefix):
            if key.name not in groups:  # a field that holds a group's mapping (EvalConfig.task)
                keys.setdefault(key.name, key)
    for top in tops:
        comments = _yaml_comments(conf_dir / f"{top}.yaml")
        for name, value in _yaml(conf_dir, top).items():
            if name not in ("defaults", "hydra") and not isinstance(value, dict) and name not in keys:
                keys[name] = Key(name, type(value).__name__ if value is not None else "", _one_line(comments.get(name, "")))
    lines = [f"{spec.prog} [GROUP=OPTION ...] [KEY=VALUE ...]", f"  {spec.summary}", "",
             "Config groups (GROUP=OPTION; * marks the default):"]
    for group in [*groups, *(g for g in spec.extra_groups if g not in groups)]:
        names = [f"{o}*" if o == groups.get(group) else o for o in options(conf_dir, group)]
        shown = group if group in groups else f"+{group}"
        lines.append(f"  {shown:<12} {' '.join(names)}")
    chosen = ", ".join(f"{g}={picked.get(g, d)}" for g, d in groups.items())
    values = "; `--cfg job` prints every value" if spec.hydra_flags else ""
    lines += ["", f"Keys (KEY=VALUE) for {chosen}{values}:" if chosen else f"Keys (KEY=VALUE){values}:"]
    width = min(max((len(k) for k in keys), default=0), 36)
    for key in keys.values():
        lines.append(f"  {key.name:<{width}}  {key.doc}".rstrip())
    if spec.hydra_flags:
        lines += ["", "Hydra's own flags: --cfg job, --multirun (-m), --info, --hydra-help."]
    return "\n".join(lines) + "\n"
