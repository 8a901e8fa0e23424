"""What the one-shot command lines (`generate`, `eval`) share: compose a `conf/` file with the
command line's overrides, type it, and turn any bad input into one `error:` line on stderr and
status 1; and `note`, the status lines they print on stderr while they load and compile.

The Compose API is used rather than `@hydra.main`: a one-shot command needs no run directory or
logging setup. `planner.tools.entry.compose` checks the command line first (an unknown key or
group option is one line with the nearest valid names) and `--help` lists the groups and keys.
stdout carries only the command's output (docs/design.md §8.7), so a script that reads it is not
disturbed by the status lines.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any, TypeVar

from dataclasses import replace

from hydra.errors import HydraException
from omegaconf.errors import OmegaConfBaseException

from jaxrl_async.cli.help import CONF_DIR, help_spec
from planner.tools import entry
from planner.tools.help import help_text

Config = TypeVar("Config")


def note(message: str) -> None:
    """One status line on stderr (`loading model tiny …`), at once: the command is otherwise
    silent for the seconds a load or a compilation takes."""
    print(message, file=sys.stderr, flush=True)


def run_command(config_name: str, summary: str, node: type, argv: list[str] | None,
                typed: Callable[[dict[str, Any]], Config], work: Callable[[Config], Any],
                show: Callable[[Config, Any], str]) -> int:
    """Compose `conf/<config_name>.yaml` (its top level: `node`'s defaults) with `argv` (default:
    sys.argv[1:]), `typed` it, run `work` on it and print `show(config, result)`; exit status 0,
    or 1 with one `error:` line. `--help` prints the keys under `summary`, the command's one line."""
    overrides = sys.argv[1:] if argv is None else argv
    if entry.wants_help(overrides):
        spec = replace(help_spec(f"python -m jaxrl_async.{config_name}", summary), hydra_flags=False, extra_groups=())
        print(help_text(CONF_DIR, config_name, spec, [a for a in overrides if a not in entry.HELP_FLAGS]), end="")
        return 0
    from jaxrl_async.cli.config_nodes import register_config_nodes  # the registries import JAX: not for --help

    register_config_nodes({config_name: node})
    try:
        # entry.compose: an unknown key or group option is one line with the nearest valid names
        config = typed(entry.compose(CONF_DIR, config_name, overrides))
        result = work(config)
    except (ValueError, HydraException, OmegaConfBaseException) as e:
        print(f"error: {entry.one_line(e)}", file=sys.stderr)
        return 1
    print(show(config, result), end="")
    return 0


def run_cached(main: Callable[[], int]) -> None:
    """A one-shot command's `python -m` entry: the on-disk compilation cache (library code and
    tests call `main` and never turn it on; `--help` needs no JAX), then `main`'s exit status."""
    if not entry.wants_help(sys.argv[1:]):
        from jaxrl_async.compilation_cache import enable_compilation_cache

        enable_compilation_cache()
    sys.exit(main())
