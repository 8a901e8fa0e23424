#!/usr/bin/env bash
# Mutation testing of the planner's core and the controller's fault/resume path (issue 11 item 3).
#
#   benchmarks/mutation.sh [MODULE ...]      MODULE: feasibility lookahead ledger audit controller outbox groups
#                                           (default: all seven; results in benchmarks/results/mutation.md)
#
# Not run in CI: a module takes minutes to tens of minutes (each mutant reruns the tests that
# reach its function). Needs mutmut 3.x: pip install -e '.[mutation]'.
#
# Why a scratch copy per module: mutmut 3 reads its settings from pyproject.toml's [tool.mutmut]
# and writes mutants/ next to it. Each module gets its own copy of the working tree (tracked and
# untracked-not-ignored files) under $MUTATION_DIR/<module>, with a [tool.mutmut] section that
# mutates that one file and selects only that module's fast tests, so the repository itself never
# holds mutmut settings or mutants, and a rerun reuses mutmut's cache of unchanged mutants.
# For the controller only the fault/resume functions are run (mutmut names mutants per function:
# `module.xǁClassǁmethod__mutmut_N`); the other controller mutants are generated but not run.
#
# Environment: MUTATION_DIR (default /tmp/jaxrl-mutation), MUTATION_CHILDREN (parallel mutants,
# default 1: keep it low on a shared machine), PYTHON (default: the python on PATH).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
WORK="${MUTATION_DIR:-/tmp/jaxrl-mutation}"
CHILDREN="${MUTATION_CHILDREN:-1}"
PYTHON="${PYTHON:-python}"
MUTMUT="$(cd "$(dirname "$(command -v "$PYTHON")")" && pwd)/mutmut"  # absolute: each run cds into its copy
[ -x "$MUTMUT" ] || MUTMUT=mutmut

# module -> file to mutate | mutant-name globs (space separated) | test files (space separated)
C='jaxrl_async.runtime.controller.xǁControllerǁ'
declare -A FILE GLOBS TESTS
FILE[feasibility]=planner/feasibility.py
GLOBS[feasibility]='planner.feasibility.*'
TESTS[feasibility]='tests/planner/test_feasibility.py'
FILE[lookahead]=planner/policies/lookahead.py
GLOBS[lookahead]='planner.policies.lookahead.*'
TESTS[lookahead]='tests/planner/test_feasibility.py tests/planner/policies/test_lookahead.py tests/planner/policies/test_lookahead_faults.py tests/planner/policies/test_lookahead_admission.py'
FILE[ledger]=planner/ledger.py
GLOBS[ledger]='planner.ledger.*'
TESTS[ledger]='tests/planner/test_ledger.py tests/planner/test_ledger_audit.py'
FILE[audit]=planner/ledger_audit.py
GLOBS[audit]='planner.ledger_audit.*'
TESTS[audit]='tests/planner/test_ledger_audit.py'
FILE[controller]=jaxrl_async/runtime/controller.py
GLOBS[controller]="${C}_regenerate__mutmut_* ${C}_regenerate_lost__mutmut_* ${C}admit_group__mutmut_* \
${C}restore__mutmut_* ${C}_begin__mutmut_* ${C}snapshot__mutmut_* \
${C}save_checkpoint__mutmut_* ${C}load_checkpoint_meta__mutmut_* ${C}drop_group__mutmut_*"
TESTS[controller]='tests/jaxrl_async/runtime/test_controller_fault_path.py'
# The start barriers (the controller's former _release_held) live in the outbox.
FILE[outbox]=jaxrl_async/runtime/outbox.py
GLOBS[outbox]='jaxrl_async.runtime.outbox.*'
TESTS[outbox]='tests/jaxrl_async/runtime/test_outbox.py tests/jaxrl_async/runtime/test_controller_fault_path.py'
# The window and the live groups (the controller's former held/_refill_window/restore loop) live in groups.py.
FILE[groups]=jaxrl_async/runtime/groups.py
GLOBS[groups]='jaxrl_async.runtime.groups.*'
TESTS[groups]='tests/jaxrl_async/runtime/test_groups.py tests/jaxrl_async/runtime/test_controller_fault_path.py'

toml_list() { local out="" x; for x in "$@"; do out+="\"$x\", "; done; echo "[${out%, }]"; }

run_module() {
    local m=$1 dir="$WORK/$1"
    [ -n "${FILE[$m]:-}" ] || { echo "error: unknown module '$m' (feasibility lookahead ledger audit controller outbox groups)" >&2; exit 2; }
    # A fresh copy of the tree; MUTATION_KEEP=1 keeps mutants/ and mutmut's results (only for
    # reruns after a product change: mutmut does not rerun a mutant because a test changed).
    if [ "${MUTATION_KEEP:-0}" != 1 ]; then rm -rf "$dir"; fi
    mkdir -p "$dir"
    (cd "$ROOT" && git ls-files -co --exclude-standard -z | tar --null -T - -cf -) | tar -xf - -C "$dir"
    local tests; read -r -a tests <<< "${TESTS[$m]}"
    cat >> "$dir/pyproject.toml" <<EOF

[tool.mutmut]
source_paths = ["planner", "jaxrl_async"]
only_mutate = ["${FILE[$m]}"]
pytest_add_cli_args = ["-p", "no:cacheprovider", "-q", "-o", "addopts="]
pytest_add_cli_args_test_selection = $(toml_list "${tests[@]}")
use_git_change_detection = false
EOF
    local globs; read -r -a globs <<< "${GLOBS[$m]}"
    echo "== $m: ${FILE[$m]} against ${TESTS[$m]}"
    (cd "$dir" && env -u PYTHONPATH HYPOTHESIS_PROFILE=mutation "$MUTMUT" run --max-children "$CHILDREN" "${globs[@]}" \
        > "$dir/run.log" 2>&1) || { tail -30 "$dir/run.log"; echo "error: mutmut failed on $m (log: $dir/run.log)" >&2; return 1; }
    (cd "$dir" && env -u PYTHONPATH "$MUTMUT" results --all true > "$dir/results.txt" 2>&1)
    "$PYTHON" "$ROOT/benchmarks/mutation_score.py" "$m" "$dir/results.txt" "${globs[@]}"
}

modules=("$@")
[ ${#modules[@]} -gt 0 ] || modules=(feasibility lookahead ledger audit controller outbox groups)
for m in "${modules[@]}"; do run_module "$m"; done
