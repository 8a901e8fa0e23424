"""What `--help` reads for the commands on conf/ (train, generate, eval, serve): each `base/` node's
config dataclass as "module:QualName", imported by planner/tools/help.py only when the command
line's groups reach it. Every config module named here imports no JAX (docs/design.md §6), so
`--help` answers at once; this module itself imports nothing of the package.
tests/jaxrl_async/cli/test_config_nodes.py keeps `HELP_NODES` equal to what
cli/config_nodes.py registers.
"""

from __future__ import annotations

from pathlib import Path

CONF_DIR = Path(__file__).resolve().parents[2] / "conf"  # every command composes conf/ from the repository root
# ConfigStore path -> "module:QualName" of the dataclass whose fields (and their docs) it lists.
HELP_NODES = {
    "train": "jaxrl_async.runtime.config:RunConfig",
    "generate": "jaxrl_async.cli.generate:GenerateConfig",
    "eval": "jaxrl_async.cli.eval:EvalConfig",
    "serve": "jaxrl_async.cli.serve:ServeConfig",
    "trainer": "jaxrl_async.trainer.config:TrainerConfig",
    "engine/jax": "jaxrl_async.engines.jax.config:EngineConfig",
    "engine/vllm": "jaxrl_async.engines.vllm.config:VllmEngineConfig",
    "cluster/local": "jaxrl_async.cluster.config:ProcessConfig",
    "cluster/ray": "jaxrl_async.cluster.ray.config:RayClusterConfig",
    "cluster/slurm": "jaxrl_async.cluster.config:ProcessConfig",
    "task/arithmetic": "jaxrl_async.tasks.arithmetic:ArithmeticConfig",
    "task/calculator": "jaxrl_async.tasks.calculator:CalculatorConfig",
    "task/custom": "jaxrl_async.tasks.custom:CustomConfig",
    "task/gsm8k": "jaxrl_async.tasks.gsm8k:GSM8KConfig",
    "task/reasoning_gym": "jaxrl_async.tasks.reasoning_gym:ReasoningGymConfig",
    "task/guess_number": "jaxrl_async.tasks.guess_number:GuessNumberConfig",
    "task/repeat_letter": "jaxrl_async.tasks.synthetic:RepeatLetterConfig",
    "task/copy_string": "jaxrl_async.tasks.synthetic:CopyStringConfig",
    "task/verifiers": "jaxrl_async.tasks.verifiers_env:VerifiersConfig",
}
MODEL_SPEC = "jaxrl_async.models.config:ModelSpec"  # conf/model/*.yaml: no defaults node


def help_spec(prog: str, summary: str):
    """What `--help` reads for a command on conf/ (train, generate, eval, serve): planner/tools/help.py."""
    from planner.registry import policy_class
    from planner.tools.help import HelpSpec

    return HelpSpec(prog, summary, HELP_NODES,
                    {"policy": lambda name: policy_class(name).Params, "model": lambda name: MODEL_SPEC},
                    extra_groups=("experiment",))
