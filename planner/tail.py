"""`python -m planner.tail`: the stable command name. The command lives in `planner.tools.tail`;
this module only forwards to its `main`, so the name people type and scripts call never moves."""

from planner.tools.tail import main

if __name__ == "__main__":
    raise SystemExit(main())
