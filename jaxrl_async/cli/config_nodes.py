"""Every training-side config dataclass's defaults as Hydra ConfigStore nodes (`base/<group>/<name>`).

The defaults live in the dataclasses only; `conf/` states what differs. For Hydra to take a
command-line override of a key, the composed config must hold that key, so each group file lists
its dataclass's node first (`defaults: [/base/engine/jax@_here_, _self_]`) and Hydra merges the
YAML over it. Call `register_config_nodes()` before composing `conf/` (cli/train.py and
cli/common.py `run_command` do, and so do the tests' compose helpers); the simulator's nodes are
planner/tools/simulate.py's. The one-shot commands' own top levels (`base/generate`, `base/eval`) are
registered by `run_command` from the command's config class, so this module imports no command
(a command imports it).

To add a group option: its dataclass in the registry that types it (engines/registry.py,
cluster/config.py CLUSTER_MODES, tasks TASKS) is picked up here; a new group gets a line below.
"""

from __future__ import annotations

from jaxrl_async.cluster.config import CLUSTER_MODES
from jaxrl_async.engines.registry import ENGINES
from jaxrl_async.runtime.config import RunConfig
from jaxrl_async.tasks import TASKS
from jaxrl_async.trainer.config import TrainerConfig
from planner.configs import register_defaults


def config_nodes() -> dict[str, type]:
    """ConfigStore path (under `base/`) -> the dataclass whose defaults it holds."""
    return {
        "train": RunConfig,  # the top level of conf/train.yaml
        "trainer": TrainerConfig,
        **{f"engine/{name}": entry.config for name, entry in ENGINES.items()},
        **{f"cluster/{name}": mode.config for name, mode in CLUSTER_MODES.items()},
        **{f"task/{name}": task.config_class for name, task in TASKS.items()},
    }


def register_config_nodes(extra: dict[str, type] | None = None) -> None:
    """Store `config_nodes()` (and `extra`, e.g. a command's top level) in Hydra's ConfigStore."""
    register_defaults({**config_nodes(), **(extra or {})})
