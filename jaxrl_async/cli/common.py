"""What the one-shot command lines (`generate`, `eval`) share: compose a `conf/` file with the
command line's overrides, type it, and turn any bad input into one `error:` line on stderr and
status 1; and `note`, the status lines they print on stderr while they load and compile.

The Compose API is used rather than `@hydra.main`: a one-shot command needs no run directory or
logging setup, and Hydra's own multi-line errors (e.g. the list of available models) are joined
into one line. stdout carries only the command's output (docs/design.md §8.7), so a script that
reads it is not disturbed by the status lines.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from hydra import compose, initialize_config_dir
from hydra.errors import HydraException
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from jaxrl_async.cli.config_nodes import register_config_nodes

CONF_DIR = Path(__file__).resolve().parents[2] / "conf"
Config = TypeVar("Config")


def note(message: str) -> None:
    """One status line on stderr (`loading model tiny …`), at once: the command is otherwise
    silent for the seconds a load or a compilation takes."""
    print(message, file=sys.stderr, flush=True)


def run_command(config_name: str, node: type, argv: list[str] | None, typed: Callable[[dict[str, Any]], Config],
                work: Callable[[Config], Any], show: Callable[[Config, Any], str]) -> int:
    """Compose `conf/<config_name>.yaml` (its top level: `node`'s defaults) with `argv` (default:
    sys.argv[1:]), `typed` it, run `work` on it and print `show(config, result)`; exit status 0,
    or 1 with one `error:` line."""
    overrides = sys.argv[1:] if argv is None else argv
    register_config_nodes({config_name: node})
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            composed = compose(config_name=config_name, overrides=overrides)
        config = typed(OmegaConf.to_container(composed, resolve=True))
        result = work(config)
    except (ValueError, HydraException, OmegaConfBaseException) as e:
        message = " ".join(line.strip() for line in str(e).splitlines() if line.strip())
        print(f"error: {message or type(e).__name__}", file=sys.stderr)
        return 1
    print(show(config, result), end="")
    return 0
