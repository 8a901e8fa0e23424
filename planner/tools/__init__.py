"""The planner's commands and analyses, apart from its contract at `planner/`'s root.

Commands: simulate, compare, tune, calibrate, audit (`python -m planner.tools.X`, or the stable
`python -m planner.X`, a shim at the root that only forwards to `main`). Analyses they share:
plots, fidelity, length_bias, run_trace (the real run's timing trace). What every command line
shares, the planner's and the trainer's alike: entry (bad input as one line naming what the user
typed, the Hydra entry wrapper) and help (`--help` from the config dataclasses' `Attributes:` docs).

The contract (base, types, driver, versions, run_files, ledger, registry, policies/, sim/, ...)
borrows two analyses from here: the simulator reads real runs' traces as workloads (run_trace)
and writes the audit's length-bias certificate into its summary (length_bias). A new command goes
here, with a root shim only if people or scripts outside the repository type its name.
"""
