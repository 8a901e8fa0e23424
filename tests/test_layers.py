"""Import boundaries: planner/ stays pure (no jax, asyncio or jaxrl_async), the runtime does
not depend on where its processes run (no jaxrl_async.cluster from jaxrl_async/runtime/), the
engine configs load no backend, and the engine modules import each other without a cycle."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
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


# The `python -m jaxrl_async.train|eval|generate|serve` shims: they only forward to jaxrl_async/cli/.
COMMAND_SHIMS = ("jaxrl_async/train.py", "jaxrl_async/eval.py", "jaxrl_async/generate.py", "jaxrl_async/serve.py")


def test_only_the_command_shims_import_the_command_lines():
    """A command imports the library, never the other way round (runtime/evaluation.py once imported
    the eval command, and config_nodes the commands that import it: an import cycle)."""
    found = [line for line in offenders("jaxrl_async", ("jaxrl_async.cli",))
             if not line.startswith(("jaxrl_async/cli/", *COMMAND_SHIMS))]
    assert found == []
    commands = ("jaxrl_async.cli.eval", "jaxrl_async.cli.generate", "jaxrl_async.cli.serve", "jaxrl_async.cli.train")
    shared = [REPO / "jaxrl_async" / "cli" / name for name in ("common.py", "config_nodes.py")]
    assert [(p.name, name) for p in shared for name in imports(p) if name in commands] == []


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


# Engine and cluster config modules: typing a run's config and `--help` load no backend (docs/design.md §6).
CONFIG_MODULES = ("jaxrl_async.engines.jax.config", "jaxrl_async.engines.vllm.config",
                  "jaxrl_async.engines.speculation", "jaxrl_async.cluster.ray.config",
                  "jaxrl_async.cluster.config")
BACKENDS = ("jax", "jaxlib", "flax", "optax", "ray", "vllm", "torch")


def test_the_config_modules_import_no_backend_not_even_transitively():
    """In a fresh interpreter, so that what the modules pull in through other packages counts
    (EngineConfig once reached flax through the models package's `__init__`)."""
    code = ("import importlib, sys\n"
            f"for name in {CONFIG_MODULES!r}: importlib.import_module(name)\n"
            f"print(sorted({{m.split('.')[0] for m in sys.modules}} & set({BACKENDS!r})))")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]", done.stdout


def package_graph(folder: str) -> dict[str, set[str]]:
    """module -> the modules of the same package it imports, at module level, inside a function or
    under TYPE_CHECKING alike (`from pkg import mod` counts as importing pkg.mod)."""
    root = REPO / folder
    modules = {".".join(p.relative_to(REPO).with_suffix("").parts): p for p in root.rglob("*.py")
               if p.name != "__init__.py"}
    graph = {}
    for name, path in modules.items():
        found = set()
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                found |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                found |= {node.module} | {f"{node.module}.{alias.name}" for alias in node.names}
        graph[name] = found & set(modules) - {name}
    return graph


def cycle_in(graph: dict[str, set[str]]) -> list[str]:
    """One import cycle of `graph` (as a path that returns to its start), or []."""
    state: dict[str, str] = {}

    def visit(node: str, path: list[str]) -> list[str]:
        state[node] = "open"
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt, path + [nxt])):
                return found
        state[node] = "done"
        return []

    for start in sorted(graph):
        if start not in state and (found := visit(start, [start])):
            return found
    return []


def test_the_engine_modules_import_each_other_without_a_cycle():
    """The JAX core, migration and paging once imported each other (migration read the core's
    private members): the core's collaborators use its public slot API (engines/jax/slots.py)."""
    assert cycle_in(package_graph("jaxrl_async/engines")) == []


def test_only_the_server_app_and_its_command_import_fastapi_and_uvicorn():
    """FastAPI and uvicorn are the optional `serve` extra: the engine client and the wire schema
    (jaxrl_async/serving/) stay importable without them, for the runtime to reuse."""
    found = [line for line in offenders("jaxrl_async", ("fastapi", "uvicorn", "starlette"))
             if not line.startswith(("jaxrl_async/serving/app.py", "jaxrl_async/cli/serve.py"))]
    assert found == []
