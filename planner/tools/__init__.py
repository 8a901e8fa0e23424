"""The planner's commands, and nothing else: the package's contract and analyses sit below them.

Commands: simulate, compare, tune, calibrate (with calibrate_tail, its speculation and migration
terms), audit, tail, plots (`python -m planner.tools.X`, or the stable `python -m planner.X`, a
shim at the root that only forwards to `main`). What every command line shares, the planner's and
the trainer's alike: entry (bad input as one line naming what the user typed, the Hydra entry
wrapper) and help (`--help` from the config dataclasses' `Attributes:` docs).

What the commands, the simulator and the runtime share lives in the package, below them: the
timing trace (planner/run_trace.py), the audit's rules (planner/ledger_audit.py), the tail analysis
(planner/tail_analysis.py), the length-bias certificate (planner/length_bias.py) and the
replay-vs-real figures (planner/fidelity.py). Nothing outside this folder imports it but the root
command shims and jaxrl_async/cli/ (tests/test_layers.py). A new command goes here, with a root
shim only if people or scripts outside the repository type its name.
"""
