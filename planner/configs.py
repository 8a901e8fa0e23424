"""Typed configs from composed mappings: one builder and one validation helper for every config.

Every config section (`sim.workers`, `trainer.optim`, `engine`, `cluster.distributed`, a task, a
policy's parameters, a workload, the simulator's and the run's top level, ...) is a frozen
dataclass whose fields carry the defaults and whose `__post_init__` validates values with `check`.
`build` turns a plain mapping (Hydra's composed config, `OmegaConf.to_container`) into that
dataclass and adds the two checks a dataclass cannot make itself — an unknown key, a missing
required key and a value of the wrong type (text in a number field, checked against the field's
annotation) — as one-line errors naming the dotted key the user typed; a field typed as another
config dataclass is built from its mapping by `build` itself, so no config writes its own nesting.
The type check runs before the dataclass's own `__post_init__`, so a rule such as `c0 >= 0` only
ever sees a number, and every section of every command gets it without writing it.

`defaults(cls)` is the same dataclass as plain data. The entry points store it in Hydra's
ConfigStore (`register_defaults`, node `base/<group>/<name>`) and each `conf/` file lists that
node first in its `defaults`, so the dataclass is the one place a default lives, the YAML states
only what differs, and every key still exists for a command-line override (Hydra refuses an
override of a key the composed config lacks).

Used by planner/ and jaxrl_async/ alike: pure Python, Hydra imported only by `register_defaults`.
"""

from __future__ import annotations

import dataclasses
import re
import types
import typing
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

T = TypeVar("T")

# Hydra's mark for a value the user must give; `defaults` writes it for a required field, and
# `build` treats it as absent, so the error says which key to set.
MISSING = "???"


def check(ok: bool, name: str, value: Any, rule: str) -> None:
    """One-line ValueError `name=value: rule` unless `ok`: the dotted key, its value, the rule and the fix."""
    if not ok:
        raise ValueError(f"{name}={value!r}: {rule}")


def _key(section: str, name: str) -> str:
    return f"{section}.{name}" if section else name


def check_keys(values: Mapping[str, Any], known: typing.Iterable[str], section: str, *, what: str = "key") -> None:
    """An unknown key of `section` is a one-line ValueError naming it and the known keys; `what`
    names the kind of key where the section has variants ("key for task 'repeat_letter'")."""
    known = sorted(known)
    unknown = sorted(set(values) - set(known))
    if unknown:
        raise ValueError(f"{_key(section, unknown[0])}: unknown {what} (known: {', '.join(known) or 'none'})")


def _nested(hint: Any) -> type | None:
    """The config dataclass a field holds (also when optional), else None."""
    options = typing.get_args(hint) if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union \
        else (hint,)
    found = [t for t in options if isinstance(t, type) and dataclasses.is_dataclass(t)]
    return found[0] if len(found) == 1 else None


def _options(hint: Any) -> tuple[Any, ...]:
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        return typing.get_args(hint)
    return (hint,)


def _describe(hint: Any) -> str:
    """What a value of `hint` is, in the user's words ("a number", "a list of integers", "null")."""
    if hint is type(None):
        return "null"
    if hint is bool:
        return "true or false"
    if hint is int:
        return "an integer"
    if hint is float:
        return "a number"
    if hint is str:
        return "a string"
    origin = typing.get_origin(hint)
    if origin is typing.Literal:
        return "one of " + ", ".join(str(a) for a in typing.get_args(hint))
    if origin in (tuple, list, Sequence) or hint in (tuple, list):
        args = [a for a in typing.get_args(hint) if a is not Ellipsis]
        return f"a list of {_plural(args[0])}" if len(args) == 1 else "a list"
    if origin in (dict, Mapping) or hint in (dict, Mapping) or (isinstance(hint, type) and dataclasses.is_dataclass(hint)):
        return "a mapping"
    return "any value"


def _plural(hint: Any) -> str:
    words = " or ".join(_describe(o) for o in _options(hint))
    return {"an integer": "integers", "a number": "numbers", "a string": "strings", "true or false": "booleans"}.get(
        words, words)


def _type_error(hint: Any, value: Any) -> str | None:
    """None when `value` fits the annotation `hint`, else the rule it breaks ("must be a number").

    A number field takes an integer, never a boolean; a tuple or list field takes either sequence;
    a field typed as a config dataclass takes a mapping (`build` checks its keys); an annotation
    this does not know (Any, a class) takes anything."""
    if _fits(hint, value):
        return None
    options = _options(hint)
    words = [_describe(o) for o in options if o is not type(None)]
    rule = "must be " + " or ".join(words)
    return rule + ", or null" if type(None) in options else rule


def _fits(hint: Any, value: Any) -> bool:
    if hint is Any or isinstance(hint, typing.TypeVar):
        return True
    options = _options(hint)
    if len(options) > 1:
        return any(_fits(o, value) for o in options)
    if hint is type(None):
        return value is None
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is str:
        return isinstance(value, str)
    origin = typing.get_origin(hint)
    if origin is typing.Literal:
        return value in typing.get_args(hint)
    if origin in (tuple, list, Sequence) or hint in (tuple, list):
        if not isinstance(value, (list, tuple)):
            return False
        args = typing.get_args(hint)
        if origin is tuple and args and (len(args) != 2 or args[1] is not Ellipsis):
            return len(args) == len(value) and all(_fits(a, v) for a, v in zip(args, value))
        return not args or all(_fits(args[0], v) for v in value)
    if origin in (dict, Mapping) or hint in (dict, Mapping):
        return isinstance(value, Mapping)
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return isinstance(value, (Mapping, hint))
    return True


def check_type(hint: Any, name: str, value: Any, *, has_default: bool = False) -> None:
    """One-line ValueError `name=value: must be ...` unless `value` fits the annotation `hint`.

    A null is written as the user types it; where the field `has_default`, the error says how to
    get the default back (`???`, Hydra's "not given", which `build` treats as absent): null is a
    value, never "the default", so `policy.window_fraction=null` and `???` differ."""
    rule = _type_error(hint, value)
    if rule is None:
        return
    if value is None:
        raise ValueError(f"{name}=null: {rule}" + (" (leave it ??? for its default)" if has_default else ""))
    raise ValueError(f"{name}={value!r}: {rule}")


def given(values: Mapping[str, Any] | None) -> dict[str, Any]:
    """The keys `values` sets: every key but those left `???` (MISSING), which take their default."""
    return {k: v for k, v in (values or {}).items() if not (isinstance(v, str) and v == MISSING)}


def build(cls: type[T], values: Mapping[str, Any] | None, section: str, *, what: str = "key") -> T:
    """`cls(**values)` with one-line errors for an unknown or a missing key, or a value whose type
    does not fit the field's annotation, naming `section.key`.

    A field typed as a config dataclass (or optional one) is built from its mapping here, under
    `section.field`; a value that already is the dataclass is kept. `section` "" is the top level.
    """
    values = given(values)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    check_keys(values, fields, section, what=what)
    required = {name for name, f in fields.items()
                if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING}
    for name in fields:
        if name not in values and name in required:
            raise ValueError(f"{_key(section, name)}: required key missing (set {_key(section, name)}=...)")
    hints = typing.get_type_hints(cls)
    for name, value in values.items():
        check_type(hints[name], _key(section, name), value, has_default=name not in required)
        sub = _nested(hints[name])
        if sub is not None and isinstance(value, Mapping):
            values[name] = build(sub, value, _key(section, name))
    try:
        return cls(**values)
    except ValueError as e:  # a rule of __post_init__: in the user's words, the key they typed
        raise ValueError(in_section(str(e), cls, section)) from None


def in_section(message: str, cls: type, section: str) -> str:
    """`message` with the class's own name for its fields (`OptimConfig.lr`, as `__post_init__`
    checks write it) replaced by the dotted key the user types (`trainer.optim.lr`)."""
    return re.sub(rf"\b{re.escape(cls.__name__)}\.", f"{section}." if section else "", message)


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    return value


def defaults(cls: type) -> dict[str, Any]:
    """Every field of `cls` at its default, as plain data (nested dataclasses as mappings, tuples
    as lists); a required field is `MISSING`."""
    out = {}
    for f in dataclasses.fields(cls):
        if f.default is not dataclasses.MISSING:
            out[f.name] = _plain(f.default)
        elif f.default_factory is not dataclasses.MISSING:
            out[f.name] = _plain(f.default_factory())
        else:
            out[f.name] = MISSING
    return out


def register_defaults(nodes: Mapping[str, type]) -> None:
    """Store `defaults(cls)` in Hydra's ConfigStore as `base/<path>` for every `path -> cls`
    (e.g. "engine/jax" -> EngineConfig: a `conf/engine/jax.yaml` lists `/base/engine/jax@_here_`
    first in its defaults). Plain mappings, not structured configs: OmegaConf's typed nodes
    cannot hold unions such as `bool | str | None`, and `build` checks the keys anyway.
    Storing again replaces the node, so every entry point may call it."""
    from hydra.core.config_store import ConfigStore

    store = ConfigStore.instance()
    for path, cls in nodes.items():
        group, _, name = f"base/{path}".rpartition("/")
        store.store(group=group, name=name, node=defaults(cls))
