"""What the one-shot command lines (`generate`, `eval`) share: compose a `conf/` file with the
command line's overrides, type it, and turn any bad input into one line on stderr and status 1.

The Compose API is used rather than `@hydra.main`: a one-shot command needs no run directory or
logging setup, and Hydra's own multi-line errors (e.g. the list of available models) are joined
into one line.
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
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    from jaxrl_async.config_nodes import register_config_nodes

    overrides = sys.argv[1:] if argv is None else argv
    register_config_nodes()
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
