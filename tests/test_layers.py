"""Import boundaries: planner/ stays pure (no jax, asyncio or jaxrl_async), and the runtime does
not depend on where its processes run (no jaxrl_async.cluster from jaxrl_async/runtime/)."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def imports(path: Path) -> set[str]:
    """Every absolute module name `path` imports, at module level or inside a function."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module)
    return found


def offenders(folder: str, forbidden: tuple[str, ...]) -> list[str]:
    return sorted(f"{path.relative_to(REPO)} imports {name}" for path in (REPO / folder).rglob("*.py")
                  for name in imports(path) if any(name == f or name.startswith(f + ".") for f in forbidden))


def test_the_planner_imports_neither_jax_nor_asyncio_nor_the_trainer():
    assert offenders("planner", ("jax", "jaxlib", "flax", "optax", "asyncio", "jaxrl_async", "vllm", "ray")) == []


def test_the_runtime_does_not_import_the_cluster_package():
    assert offenders("jaxrl_async/runtime", ("jaxrl_async.cluster",)) == []


def test_the_engines_count_tokens_with_planner_versions_not_the_driver():
    assert offenders("jaxrl_async/engines", ("planner.driver",)) == []


# The `python -m jaxrl_async.train|eval|generate` shims: they only forward to jaxrl_async/cli/.
COMMAND_SHIMS = ("jaxrl_async/train.py", "jaxrl_async/eval.py", "jaxrl_async/generate.py")


def test_only_the_command_shims_import_the_command_lines():
    """A command imports the library, never the other way round (runtime/evaluation.py once imported
    the eval command, and config_nodes the commands that import it: an import cycle)."""
    found = [line for line in offenders("jaxrl_async", ("jaxrl_async.cli",))
             if not line.startswith(("jaxrl_async/cli/", *COMMAND_SHIMS))]
    assert found == []
    commands = ("jaxrl_async.cli.eval", "jaxrl_async.cli.generate", "jaxrl_async.cli.train")
    shared = [REPO / "jaxrl_async" / "cli" / name for name in ("common.py", "config_nodes.py")]
    assert [(p.name, name) for p in shared for name in imports(p) if name in commands] == []


# Config modules that typing a config (and `--help`) imports: none may pull in a heavy package.
# Read from a fresh interpreter's sys.modules, so an import made by anything they import counts.
RAY_CONFIGS = ("jaxrl_async.cluster.ray.config", "jaxrl_async.cluster.config")
HEAVY = ("jax", "jaxlib", "flax", "optax", "ray", "vllm", "torch")


def test_the_cluster_configs_import_no_jax_flax_ray_vllm_or_torch():
    import os
    import subprocess
    import sys

    probe = ("import importlib, sys; importlib.import_module(sys.argv[1]); "
             "print(' '.join(sorted({name.split('.')[0] for name in sys.modules})))")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    for module in RAY_CONFIGS:
        loaded = subprocess.run([sys.executable, "-c", probe, module], cwd=REPO, env=env, capture_output=True,
                                text=True, check=True).stdout.split()
        assert sorted(set(loaded) & set(HEAVY)) == [], f"importing {module} imports them"


# The `python -m planner.audit|tail|...` shims: they only forward to planner/tools/ (or re-export
# a command's functions under the stable name, planner/plots.py).
PLANNER_COMMAND_SHIMS = tuple(f"planner/{name}.py" for name in
                              ("audit", "calibrate", "compare", "plots", "simulate", "tail", "tune"))


def test_only_the_command_shims_and_the_trainer_commands_import_the_planner_commands():
    """planner/tools/ is a leaf: what the simulator, the runtime and the job share (the trace, the
    audit's rules, the tail analysis, length bias) sits in the package below the commands, so only
    the root shims and jaxrl_async/cli/ (the command plumbing: entry, help) import planner.tools."""
    found = [line for folder in ("planner", "jaxrl_async") for line in offenders(folder, ("planner.tools",))
             if not line.startswith(("planner/tools/", "jaxrl_async/cli/", *PLANNER_COMMAND_SHIMS))]
    assert found == []
