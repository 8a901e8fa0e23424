"""`planner.plots` / `python -m planner.plots RUN_DIR [--out DIR]`: the stable name of the run
plots (`planner.plots.run_plots(RUN_DIR)`). The functions and the command live in
`planner.tools.plots`; this module only re-exports them and forwards to its `main`."""

from planner.tools.plots import *  # noqa: F401,F403
from planner.tools.plots import main

if __name__ == "__main__":
    raise SystemExit(main())
