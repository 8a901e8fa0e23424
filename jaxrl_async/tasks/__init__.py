"""Tasks: prompt streams and verifiable rewards (see base.py for the contract).

Importing this package registers the built-in tasks in `TASKS`.
"""

# Importing a task module registers its tasks.
from jaxrl_async.tasks import arithmetic, custom, gsm8k, synthetic  # noqa: F401
from jaxrl_async.tasks.base import TASKS, Example, Prompt, Task, TaskConfig, build_task, register_task, task_config
from jaxrl_async.tasks.rewards import RewardResult, RewardRunner, load_reward_fn
from jaxrl_async.tasks.stream import PromptStream

__all__ = ["TASKS", "Example", "Prompt", "PromptStream", "RewardResult", "RewardRunner", "Task",
           "TaskConfig", "build_task", "load_reward_fn", "register_task", "task_config"]
