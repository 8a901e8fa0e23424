"""What the one-shot command lines (`generate`, `eval`) share: compose a `conf/` file with the
command line's overrides, type it, and turn any bad input into one line on stderr and status 1.

The Compose API is used rather than `@hydra.main`: a one-shot command needs no run directory or
logging setup. `planner.tools.entry.compose` checks the command line first (an unknown key or
group option is one line with the nearest valid names) and `--help` lists the groups and keys.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

CONF_DIR = Path(__file__).resolve().parent.parent / "conf"
Config = TypeVar("Config")


def run_command(config_name: str, argv: list[str] | None, typed: Callable[[dict[str, Any]], Config],
                work: Callable[[Config], Any], show: Callable[[Config, Any], str]) -> int:
    """Compose `conf/<config_name>.yaml` with `argv` (default: sys.argv[1:]), `typed` it, run
    `work` on it and print `show(config, result)`; exit status 0, or 1 with one `error:` line."""
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from jaxrl_async.config_nodes import help_spec, register_config_nodes
    from planner.tools import entry

    overrides = sys.argv[1:] if argv is None else argv
    if entry.wants_help(overrides):
        from dataclasses import replace

        from planner.tools.help import help_text

        summary = (sys.modules["__main__"].__doc__ or f"conf/{config_name}.yaml").strip().splitlines()[0]
        spec = replace(help_spec(f"python -m jaxrl_async.{config_name}", summary), hydra_flags=False, extra_groups=())
        print(help_text(CONF_DIR, config_name, spec, [a for a in overrides if a not in entry.HELP_FLAGS]), end="")
        return 0
    register_config_nodes()
    try:
        # entry.compose: an unknown key or group option is one line with the nearest valid names
        config = typed(entry.compose(CONF_DIR, config_name, overrides))
        result = work(config)
    except (ValueError, HydraException, OmegaConfBaseException) as e:
        print(f"error: {entry.one_line(e)}", file=sys.stderr)
        return 1
    print(show(config, result), end="")
    return 0
