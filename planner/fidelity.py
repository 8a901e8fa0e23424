"""`planner.fidelity`: the stable name of the replay-vs-real figures (`compare`, `figures`). The
functions live in `planner.tools.fidelity`; this module only re-exports them (it has no command)."""

from planner.tools.fidelity import *  # noqa: F401,F403
