"""The front door of every Hydra command: bad input is one line naming what the user typed.

    hydra_main(command, task)      # @hydra.main for planner.simulate, jaxrl_async.train
    compose(conf_dir, name, argv)  # the Compose API for the one-shot commands (tune, compare, eval)

Both check the command line before Hydra sees it, because Hydra's own errors for a misspelt key
or group option span 7-73 lines and suggest the wrong fix (`+max_stalenes=2` adds the typo):

- `group=option`: the option must be a file of `conf/<group>/`; else
  `policy=lookahed: unknown option (did you mean lookahead? options: ...)`.
- `key=value`: the dotted key must exist in the config composed with the command line's group
  choices; else `max_stalenes: unknown key (did you mean max_staleness?)` (difflib's nearest
  names among the section's keys, else among every dotted key). `+key` (an explicit addition),
  `~key` and `hydra.*` are left to Hydra.
- the composed config is then typed by the command's own builder (`Command.typed`, which calls
  `planner.configs.build`: unknown keys, missing keys, a value of the wrong type, each field's
  rule), so a bad value fails here too.

`hydra_main` types the config before `@hydra.main` runs, for every job of a `--multirun` sweep,
because Hydra creates the run directory before it calls the task: a rejected command leaves no
`outputs/...` folder. For the same reason it checks the run directory itself (one-run mode) before
Hydra writes `.hydra/` and the job's log there: the command's own `Command.check_run_dir` first
(jaxrl_async.train: another run holds the directory — a refused run must not rewrite that run's
`.hydra/config.yaml`), then that the directory, or the nearest folder above it that exists, can be
written (else Hydra's mkdir traceback, which names no key). A task that still rejects its input after that (exit status non-zero before
it wrote anything) gets its directory removed when the directory held nothing before the command
and holds nothing but Hydra's own files now — a resumed run's directory is never touched.

`--help` (`-h`) prints `planner/tools/help.py`'s text and exits before the command imports
anything heavy (`Command.register` may import JAX; the help does not call it).
Errors print as `error: <one line>` on stderr with exit status 1. Used by planner/ and
jaxrl_async/ alike: no JAX here.
"""

from __future__ import annotations

import argparse
import difflib
import functools
import itertools
import os
import shutil
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from planner.tools.help import HelpSpec, help_text, options

HELP_FLAGS = ("--help", "-h")
# Hydra flags that inspect instead of run, or add config sources the checks do not see: such a
# command line goes to Hydra unchecked.
HYDRA_INFO_FLAGS = ("--cfg", "-c", "--info", "-i", "--hydra-help", "--shell-completion", "-sc", "--version",
                    "--config-name", "-cn", "--config-dir", "-cd", "--config-path", "-cp", "--experimental-rerun")
HYDRA_FILES = {".hydra"}  # and the job's `<name>.log`
MAX_SWEEP_CHECKS = 256


@dataclass(frozen=True)
class Command:
    """One Hydra command: its `conf/` file, how to type it, and its help."""

    conf_dir: Path
    config_name: str  # conf/<config_name>.yaml
    help: HelpSpec
    register: Callable[[], None] = lambda: None  # store the base/* nodes (before any compose)
    # The composed mapping and the command line's overrides -> the typed config (ValueError).
    typed: Callable[[dict[str, Any], list[str]], Any] = lambda cfg, overrides: cfg
    # The typed config and `hydra.run.dir` -> a ValueError when the run must not start there
    # (called before Hydra writes anything into it).
    check_run_dir: Callable[[Any, Path], None] = lambda typed, run_dir: None


def fail(message: Any, status: int = 1) -> NoReturn:
    print(f"error: {one_line(message)}", file=sys.stderr)
    sys.exit(status)


def one_line(message: Any) -> str:
    text = " ".join(part.strip() for part in str(message).splitlines() if part.strip())
    return text or type(message).__name__


def nearest(word: str, names: Sequence[str], n: int = 3) -> list[str]:
    return difflib.get_close_matches(word, list(names), n=n, cutoff=0.6)


def _did_you_mean(matches: Sequence[str]) -> str:
    return f"did you mean {' or '.join(matches)}?" if matches else ""


def _dotted(values: Any, prefix: str = "") -> list[str]:
    out = []
    if isinstance(values, Mapping):
        for key, value in values.items():
            out.append(f"{prefix}{key}")
            out.extend(_dotted(value, f"{prefix}{key}."))
    return out


def _parse(overrides: Sequence[str]) -> list[Any]:
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    parser = OverridesParser.create()
    parsed = []
    for text in overrides:
        try:
            parsed.append(parser.parse_override(text))
        except HydraException as e:
            raise ValueError(f"{text}: not a KEY=VALUE override ({one_line(e).split('. ')[0]})") from None
    return parsed


def _values(override: Any) -> list[str]:
    if override.is_sweep_override():
        return list(override.sweep_string_iterator())
    value = override.value()
    return [] if value is None else [str(value) if not isinstance(value, str) else value]


def _groups(conf_dir: Path) -> set[str]:
    return {str(p.relative_to(conf_dir)) for p in conf_dir.rglob("*") if p.is_dir()
            and not str(p.relative_to(conf_dir)).startswith(("hydra", "base"))}


def _check_options(parsed: Sequence[Any], groups: set[str], conf_dirs: Sequence[Path]) -> list[Any]:
    """The group choices among `parsed`; a ValueError for an option no conf dir has."""
    choices = []
    for o in parsed:
        key = o.key_or_group
        if key in groups and not o.is_delete():
            known = sorted({name for d in conf_dirs for name in options(d, key)})
            for value in _values(o):
                if value not in known and value != "null":
                    hint = _did_you_mean(nearest(value, known))
                    raise ValueError(f"{key}={value}: unknown option ({hint + ' ' if hint else ''}"
                                     f"options: {', '.join(known)})")
            choices.append(o)
    return choices


def check_options(conf_dirs: Sequence[Path], overrides: Sequence[str]) -> None:
    """Only the group-option check, over several conf dirs (Hydra's `--config-dir` adds one)."""
    _check_options(_parse(overrides), set().union(*(_groups(d) for d in conf_dirs)), conf_dirs)


def check_overrides(conf_dir: Path, config_name: str, overrides: Sequence[str]) -> None:
    """The checks of the module docstring: a one-line ValueError for the first unknown group
    option or key of `overrides`, with the nearest valid names. Call `register` first."""
    parsed = _parse(overrides)
    groups = _groups(conf_dir)
    choices = _check_options(parsed, groups, [conf_dir])
    keys = [o for o in parsed if o not in choices and not (o.is_add() or o.is_force_add() or o.is_delete())
            and not o.key_or_group.startswith(("hydra.", "hydra/")) and o.key_or_group != "hydra"]
    if not keys:
        return
    group_args = [o.input_line for o in choices if not o.is_sweep_override()]
    group_args += [f"{'+' if o.is_add() else ''}{o.key_or_group}={_values(o)[0]}" for o in choices if o.is_sweep_override()]
    config = _compose_plain(conf_dir, config_name, group_args)
    everything = _dotted(config)
    for o in keys:
        node, path = config, o.key_or_group.split(".")
        for depth, part in enumerate(path):
            if isinstance(node, list):
                break  # an index into a list: Hydra checks it
            if not isinstance(node, Mapping) or part not in node:
                if not isinstance(node, Mapping):
                    raise ValueError(f"{o.key_or_group}: unknown key ({'.'.join(path[:depth])} is a value, not a section)")
                raise ValueError(_unknown_key(path, depth, node, everything, sorted(groups) if depth == 0 else []))
            node = node[part]


def _unknown_key(path: Sequence[str], depth: int, node: Mapping[str, Any], everything: Sequence[str],
                 groups: Sequence[str]) -> str:
    """`a.b.c: unknown key (did you mean ...?)` for the first segment `path[depth]` that is not there.

    The nearest names are the section's own keys (and, at the top, the group names), compared
    on that segment alone so that a shared `sim.trainer.` prefix does not make every key look
    close; a suggestion keeps the rest of the path where that exists. Without a close name: at
    the top, the dotted keys that end with what was typed or are close to it; else the section's
    known keys."""
    typed, section = ".".join(path), ".".join(path[:depth])
    join = (lambda k: f"{section}.{k}") if section else (lambda k: k)
    rest = ".".join(path[depth + 1:])
    matches = []
    for name in nearest(path[depth], [*node, *(g for g in groups if g not in node)]):
        whole = join(name) + (f".{rest}" if rest else "")
        matches.append(whole if not rest or whole in everything else join(name))
    if not matches and depth == 0:  # a nested key typed without its section (optim.lr)
        matches = nearest(typed, [k for k in everything if k.endswith(typed)]) or nearest(typed, everything)
    if matches:
        return f"{typed}: unknown key ({_did_you_mean(matches)})"
    known = ", ".join(sorted(node)) if node else "none"
    return f"{typed}: unknown key (known{' in ' + section if section else ''}: {known})"


def _compose_plain(conf_dir: Path, config_name: str, overrides: Sequence[str], *, resolve: bool = False) -> dict[str, Any]:
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    try:
        with initialize_config_dir(config_dir=str(conf_dir), version_base="1.3"):
            cfg = hydra_compose(config_name=config_name, overrides=list(overrides))
        return OmegaConf.to_container(cfg, resolve=resolve)
    except (HydraException, OmegaConfBaseException) as e:
        raise ValueError(one_line(e)) from None


def compose(conf_dir: Path, config_name: str, overrides: Sequence[str]) -> dict[str, Any]:
    """`conf/<config_name>.yaml` composed with `overrides`, resolved, as plain data, after
    `check_overrides`; any problem is a one-line ValueError."""
    check_overrides(conf_dir, config_name, overrides)
    return _compose_plain(conf_dir, config_name, overrides, resolve=True)


def wants_help(argv: Sequence[str]) -> bool:
    return any(a in HELP_FLAGS for a in argv)


def print_help(command: Command, argv: Sequence[str]) -> None:
    print(help_text(command.conf_dir, command.config_name, command.help, [a for a in argv if a not in HELP_FLAGS]),
          end="")


def _sweep_jobs(overrides: Sequence[str]) -> list[list[str]]:
    """Every job of a `--multirun` command line (the product of its sweeps), at most MAX_SWEEP_CHECKS."""
    parsed = _parse(overrides)
    axes = []
    for o in parsed:
        if o.is_sweep_override():
            prefix = "+" if o.is_add() else "++" if o.is_force_add() else ""
            axes.append([f"{prefix}{o.key_or_group}={v}" for v in o.sweep_string_iterator()])
        else:
            axes.append([o.input_line])
    return [list(job) for job in itertools.islice(itertools.product(*axes), MAX_SWEEP_CHECKS)]


def validate(command: Command, overrides: Sequence[str], *, multirun: bool = False) -> Any:
    """Type the config of every job the command line runs; the first problem is a ValueError."""
    typed = None
    for job in (_sweep_jobs(overrides) if multirun else [list(overrides)]):
        typed = command.typed(compose(command.conf_dir, command.config_name, job), job)
    return typed


def _run_dir(command: Command, overrides: Sequence[str]) -> Path | None:
    """Where `@hydra.main` will run (one-run mode), resolved now; None when it cannot say."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from omegaconf import OmegaConf

    try:
        with initialize_config_dir(config_dir=str(command.conf_dir), version_base="1.3"):
            cfg = hydra_compose(config_name=command.config_name, overrides=list(overrides), return_hydra_config=True)
        return Path(str(OmegaConf.select(cfg, "hydra.run.dir")))
    except Exception:  # noqa: BLE001 - the cleanup is best effort; validation already passed
        return None


def _only_hydra_files(run_dir: Path) -> bool:
    return run_dir.is_dir() and all(p.name in HYDRA_FILES or (p.is_file() and p.suffix == ".log")
                                    for p in run_dir.iterdir())


def check_writable(run_dir: Path) -> None:
    """A one-line ValueError naming `hydra.run.dir` when neither it nor the nearest folder above it
    that exists can be written (what Hydra's mkdir and log file need). Writes nothing: `os.access`
    answers for the user and for a read-only mount alike."""

    there = run_dir.absolute()
    while not there.exists() and there != there.parent:
        there = there.parent
    if not there.is_dir():
        raise ValueError(f"hydra.run.dir={run_dir}: cannot create it ({there} is a file)")
    if not os.access(there, os.W_OK | os.X_OK):
        read_only = bool(os.statvfs(there).f_flag & os.ST_RDONLY)
        why = "is on a read-only file system" if read_only else "is not writable by this user"
        raise ValueError(f"hydra.run.dir={run_dir}: cannot write there ({there} {why}); choose another hydra.run.dir")


def _holds_files(run_dir: Path | None) -> bool:
    return run_dir is not None and run_dir.is_dir() and any(run_dir.iterdir())


class ArgumentParser(argparse.ArgumentParser):
    """argparse for the option-style commands (audit, calibrate, launch): a usage error is one
    `error:` line naming the option and, for an unknown one, the nearest known options; exit
    status 2 (argparse's own) so that it stays apart from a command's verdict (audit: 1)."""

    def error(self, message: str) -> NoReturn:
        known = [o for o in self._option_string_actions if o.startswith("--")]
        hints = []
        if message.startswith("unrecognized arguments:"):
            for word in message.split(":", 1)[1].split():
                if word.startswith("-"):
                    hints += nearest(word.split("=")[0], known)
        hint = f" ({_did_you_mean(hints)})" if hints else ""
        fail(f"{message}{hint}; {self.prog} --help lists the options", status=2)


def _config_dir(argv: Sequence[str]) -> Path | None:
    for i, arg in enumerate(argv):
        if arg in ("--config-dir", "-cd") and i + 1 < len(argv):
            return Path(argv[i + 1])
        if arg.startswith("--config-dir="):
            return Path(arg.split("=", 1)[1])
    return None


def hydra_main(command: Command, task: Callable[[Any], Any], *, before_run: Callable[[], None] | None = None) -> None:
    """`@hydra.main(conf_dir, config_name)(task)()` behind the checks of the module docstring."""
    argv = sys.argv[1:]
    if wants_help(argv):
        print_help(command, argv)
        sys.exit(0)
    if before_run is not None:
        before_run()
    command.register()
    unchecked = any(a.split("=")[0] in HYDRA_INFO_FLAGS for a in argv)
    multirun = any(a in ("-m", "--multirun") for a in argv)
    overrides = [a for a in argv if not a.startswith("-")]
    held_before = None
    extra_dir = _config_dir(argv)
    if extra_dir is not None:  # the checks cannot compose with a second conf dir; the options they can check
        try:
            check_options([command.conf_dir, extra_dir], [o for o in overrides if o != str(extra_dir)])
        except ValueError as e:
            fail(e)
    elif not unchecked:
        try:
            typed = validate(command, overrides, multirun=multirun)
        except ValueError as e:
            fail(e)
        if not multirun:
            run_dir = _run_dir(command, overrides)
            if run_dir is not None:
                try:
                    command.check_run_dir(typed, run_dir)
                    check_writable(run_dir)
                except ValueError as e:
                    fail(e)
            held_before = run_dir if _holds_files(run_dir) else None
    started = time.time()

    @functools.wraps(task)  # Hydra names the job (and its .log file) after the task it unwraps to
    def guarded(cfg: Any) -> Any:
        from hydra.core.hydra_config import HydraConfig

        run_dir = Path(HydraConfig.get().runtime.output_dir)
        ok = False
        try:
            result = task(cfg)
            ok = True
            return result
        except SystemExit as e:
            ok = e.code in (0, None)
            raise
        finally:
            fresh = held_before is None or held_before.resolve() != run_dir.resolve()
            if not ok and not multirun and not unchecked and fresh and _only_hydra_files(run_dir) \
                    and run_dir.stat().st_mtime >= started - 1:
                shutil.rmtree(run_dir, ignore_errors=True)

    import hydra

    hydra.main(version_base="1.3", config_path=str(command.conf_dir), config_name=command.config_name)(guarded)()
