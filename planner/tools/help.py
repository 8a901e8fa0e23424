"""`--help` for a Hydra command, read from its config dataclasses themselves.

The one source of a key's meaning is its dataclass field's entry in the class docstring's
Google-style `Attributes:` section (`name: text`, continued on more deeply indented lines); an
inherited field is documented by the class that declares it (the first class of the MRO whose
section names it). The help imports each class — given as the class, or as "module:QualName"
for `importlib` — and lists `dataclasses.fields(cls)`; a field whose type is a dataclass (or
one or null) is a section, whose keys are listed under `field.`. Config modules import nothing
heavy (docs/design.md §6), so `--help` answers without importing JAX.

What the help lists follows the command's `conf/` file as Hydra would compose it: its defaults
list names the `base/<path>` nodes (each a dataclass, `planner/configs.py register_defaults`) and
the groups; the option of a group is the command line's `group=option`, else the default, so
`policy=areal --help` shows areal's native parameters. `base/*` groups are internal and never
listed. A top-level key that no dataclass holds (`planner.simulate`'s) is described by its comment
in the command's own YAML file.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import inspect
import re
import textwrap
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml

# A config dataclass for the help: the class itself, or "module:QualName" (imported on use).
Source = type | str
DOC_WIDTH = 96


@dataclass(frozen=True)
class Key:
    """One command-line key as `--help` lists it.

    Attributes:
      name: dotted, as the command line takes it.
      type: the field's annotation as written.
      doc: one line, from the declaring class's `Attributes:` entry.
    """

    name: str
    type: str
    doc: str


@dataclass(frozen=True)
class HelpSpec:
    """What a command's help needs besides its `conf/` files.

    Attributes:
      prog: how the command is typed ("python -m planner.simulate").
      summary: one line: what the command does.
      nodes: base node path ("sim", "workload/lognormal") -> its dataclass.
      option_classes: a group whose options are no base node: group -> (option -> its dataclass
        or None).
      extra_groups: groups added with +group=option (not in the defaults list).
      hydra_flags: an @hydra.main command (--cfg job, -m); false for the Compose API ones.
    """

    prog: str
    summary: str
    nodes: Mapping[str, Source]
    option_classes: Mapping[str, Callable[[str], Source | None]] = ()
    extra_groups: Sequence[str] = ()
    hydra_flags: bool = True


def config_class(source: Source) -> type:
    """The dataclass `source` names: itself, or "module:QualName" imported."""
    obj: typing.Any = source
    if isinstance(source, str):
        module, _, qualname = source.partition(":")
        obj = importlib.import_module(module)
        for part in qualname.split("."):
            obj = getattr(obj, part, None)
    if not (isinstance(obj, type) and dataclasses.is_dataclass(obj)):
        raise ValueError(f"help: {source!r} names no config dataclass")
    return obj


@functools.lru_cache(maxsize=None)
def attributes(cls: type) -> dict[str, str]:
    """The `Attributes:` section of `cls`'s own docstring (Google style): field name -> text."""
    doc = inspect.cleandoc(cls.__dict__.get("__doc__") or "")
    out: dict[str, str] = {}
    current, indent = None, None
    lines = doc.splitlines()
    start = next((i + 1 for i, line in enumerate(lines) if line.strip() == "Attributes:"), len(lines))
    for line in lines[start:]:
        if not line.strip():
            if out:
                break
            continue
        depth = len(line) - len(line.lstrip())
        m = re.match(r"\s*(\w+):(?:\s+(.*))?$", line)
        if depth == 0:
            break  # the next section
        if m and (indent is None or depth == indent):
            indent, current = depth, m.group(1)
            out[current] = (m.group(2) or "").strip()
        elif current is not None and indent is not None and depth > indent:
            out[current] = f"{out[current]} {line.strip()}".strip()
        else:
            break
    return out


def field_doc(cls: type, name: str) -> str:
    """The field's entry in the `Attributes:` of the first class of `cls`'s MRO that has one (the
    class that declares an inherited field documents it); "" when none."""
    for klass in cls.__mro__:
        if name in attributes(klass):
            return attributes(klass)[name]
    return ""


def _one_line(doc: str) -> str:
    doc = " ".join(doc.split())
    return doc if len(doc) <= DOC_WIDTH else textwrap.shorten(doc, DOC_WIDTH, placeholder=" …")


def section_class(annotation: typing.Any) -> type | None:
    """`X`, `X | None` or `Optional[X]` with X a dataclass -> X (a nested section); else None."""
    if isinstance(annotation, type):
        return annotation if dataclasses.is_dataclass(annotation) else None
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        return section_class(args[0]) if len(args) == 1 else None
    return None


def _annotation(field: dataclasses.Field) -> str:
    return field.type if isinstance(field.type, str) else getattr(field.type, "__name__", str(field.type))


def class_keys(source: Source, prefix: str = "") -> list[Key]:
    """Every leaf key of a config dataclass (nested sections flattened), with its one-line doc."""
    cls = config_class(source)
    hints = typing.get_type_hints(cls)
    out = []
    for field in dataclasses.fields(cls):
        key = f"{prefix}{field.name}"
        section = section_class(hints.get(field.name))
        if section is not None:
            out.extend(class_keys(section, f"{key}."))
        else:
            out.append(Key(key, _annotation(field), _one_line(field_doc(cls, field.name))))
    return out


def config_classes(source: Source) -> list[type]:
    """`source`'s class and every section class under it, each once (for the docs' checks)."""
    seen: list[type] = []
    todo = [config_class(source)]
    while todo:
        cls = todo.pop()
        if cls not in seen:
            seen.append(cls)
            hints = typing.get_type_hints(cls)
            todo.extend(s for f in dataclasses.fields(cls) if (s := section_class(hints.get(f.name))) is not None)
    return seen


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


@dataclass(frozen=True)
class Listing:
    """What `--help` lists for one command line.

    Attributes:
      groups: each group of the defaults list -> its default option.
      picked: the command line's `group=option` choices.
      sections: (key prefix, config dataclass) pairs the keys are read from, in order.
      keys: every key, dotted -> its `Key`.
    """

    groups: dict[str, str]
    picked: dict[str, str]
    sections: list[tuple[str, Source]]
    keys: dict[str, Key]


def _group_overrides(conf_dir: Path, group: str, option: str) -> dict[str, str]:
    """The `override /group: option` entries of a group file (`+experiment=X`) and of the sibling
    files it starts from: the options it picks for other groups."""
    out: dict[str, str] = {}
    for entry in _yaml(conf_dir, f"{group}/{option}").get("defaults", []):
        if isinstance(entry, str) and entry != "_self_":
            out.update(_group_overrides(conf_dir, group, entry))
        elif isinstance(entry, dict):
            out.update({k.removeprefix("override ").lstrip("/"): v for k, v in entry.items()
                        if k.startswith("override ")})
    return out


def listing(conf_dir: Path, config_name: str, spec: HelpSpec, argv: Sequence[str] = ()) -> Listing:
    """The groups and the keys of the command's config as `argv` picks its group options (an
    `+experiment=X` picks the options its file overrides; the command line's own choices win)."""
    picked = choices(argv)
    for group in spec.extra_groups:
        if group in picked:
            picked = {**_group_overrides(conf_dir, group, picked[group]), **picked}
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
    return Listing(groups, picked, sections, keys)


def help_text(conf_dir: Path, config_name: str, spec: HelpSpec, argv: Sequence[str] = ()) -> str:
    """The command's help: usage, its config groups and options, and every key with its meaning."""
    found = listing(conf_dir, config_name, spec, argv)
    groups, keys = found.groups, found.keys
    lines = [f"{spec.prog} [GROUP=OPTION ...] [KEY=VALUE ...]", f"  {spec.summary}", "",
             "Config groups (GROUP=OPTION; * marks the default):"]
    for group in [*groups, *(g for g in spec.extra_groups if g not in groups)]:
        names = [f"{o}*" if o == groups.get(group) else o for o in options(conf_dir, group)]
        shown = group if group in groups else f"+{group}"
        lines.append(f"  {shown:<12} {' '.join(names)}")
    chosen = ", ".join(f"{g}={found.picked.get(g, d)}" for g, d in groups.items())
    values = "; `--cfg job` prints every value" if spec.hydra_flags else ""
    lines += ["", f"Keys (KEY=VALUE) for {chosen}{values}:" if chosen else f"Keys (KEY=VALUE){values}:"]
    width = min(max((len(k) for k in keys), default=0), 36)
    for key in keys.values():
        lines.append(f"  {key.name:<{width}}  {key.doc}".rstrip())
    if spec.hydra_flags:
        lines += ["", "Hydra's own flags: --cfg job, --multirun (-m), --info, --hydra-help."]
    return "\n".join(lines) + "\n"
