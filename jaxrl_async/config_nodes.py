"""Every training-side config dataclass's defaults as Hydra ConfigStore nodes (`base/<group>/<name>`).

The defaults live in the dataclasses only; `conf/` states what differs. For Hydra to take a
command-line override of a key, the composed config must hold that key, so each group file lists
its dataclass's node first (`defaults: [/base/engine/jax@_here_, _self_]`) and Hydra merges the
YAML over it. Call `register_config_nodes()` before composing `conf/` (train.py, generate.py and
eval.py do, and so do the tests' compose helpers); the simulator's nodes are planner/tools/simulate.py's.

To add a group option: its dataclass in the registry that types it (engines/registry.py,
cluster/config.py CLUSTER_MODES, tasks TASKS) is picked up here; a new group gets a line below.
"""

from __future__ import annotations


def config_nodes() -> dict[str, type]:
    """ConfigStore path (under `base/`) -> the dataclass whose defaults it holds."""
    from jaxrl_async.cluster.config import CLUSTER_MODES
    from jaxrl_async.engines.registry import ENGINES
    from jaxrl_async.eval import EvalConfig
    from jaxrl_async.generate import GenerateConfig
    from jaxrl_async.runtime.config import RunConfig
    from jaxrl_async.tasks import TASKS
    from jaxrl_async.trainer.config import TrainerConfig

    return {
        "train": RunConfig,  # the top level of conf/train.yaml
        "generate": GenerateConfig,  # the top level of conf/generate.yaml
        "eval": EvalConfig,  # the top level of conf/eval.yaml
        "trainer": TrainerConfig,
        **{f"engine/{name}": entry.config for name, entry in ENGINES.items()},
        **{f"cluster/{name}": cls for name, cls in CLUSTER_MODES.items()},
        **{f"task/{name}": task.config_class for name, task in TASKS.items()},
    }


def register_config_nodes() -> None:
    from planner.configs import register_defaults

    register_defaults(config_nodes())
