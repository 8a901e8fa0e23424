"""Tasks: prompt streams and verifiable rewards (see base.py for the contract).

The names below are imported on first use (PEP 562), and the first use imports every built-in
task module, which registers its tasks in `TASKS`: `from jaxrl_async.tasks import TASKS` sees
them all. Importing the package alone, or one task module (`tasks.synthetic` for its config, as
`--help` does), imports no other task — gsm8k's verifier alone takes most of a second.
"""

import importlib

TASK_MODULES = ("arithmetic", "calculator", "custom", "gsm8k", "guess_number", "reasoning_gym", "synthetic",
                "verifiers_env")
_HOMES = {
    "TASKS": "base", "Example": "base", "Prompt": "base", "Task": "base", "TaskConfig": "base",
    "build_task": "base", "register_task": "base", "task_config": "base",
    "RewardResult": "rewards", "RewardRunner": "rewards", "load_reward_fn": "rewards",
    "PromptStream": "stream",
}
__all__ = sorted(_HOMES)


def __getattr__(name: str):
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    for module in TASK_MODULES:  # registers the built-in tasks
        importlib.import_module(f"{__name__}.{module}")
    return getattr(importlib.import_module(f"{__name__}.{_HOMES[name]}"), name)
