"""`planner.plots`: the stable name of the run plots (`planner.plots.run_plots(RUN_DIR)`). The
functions live in `planner.tools.plots`; this module only re-exports them (it has no command)."""

from planner.tools.plots import *  # noqa: F401,F403
