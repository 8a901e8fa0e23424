"""`python -m planner.calibrate`: the stable command name. The command lives in `planner.tools.calibrate`;
this module only forwards to its `main`, so the name people type and scripts call never moves."""

from planner.tools.calibrate import main

if __name__ == "__main__":
    raise SystemExit(main())
