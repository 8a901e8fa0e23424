"""Ctrl-C outside the training loop is one line and exit status 130, at any moment.

Python's default SIGINT raises KeyboardInterrupt wherever the main thread happens to be: inside
an import (a 40-line traceback), inside Hydra (its own traceback), or inside a garbage-collection
callback of JAX's, where the interpreter prints it as "Exception ignored" and the run goes on.
`exit_on_interrupt` replaces it, from the first line of `python -m jaxrl_async.train`, with a
handler that prints `INTERRUPTED` and ends the process (`os._exit`: no library's `finally` or
`except BaseException` can swallow it or add to it). Nothing of the run needs saving then: before
the training loop nothing is trained, after it the final checkpoint is the run's last act. The
training loop installs its own handlers (stop at the next step boundary with a checkpoint,
jaxrl_async/job/lifecycle.py; that stop exits 130 too, cli/train.py) and puts this one back when
it returns. Imports nothing heavy: it
runs before the command's own imports.
"""

from __future__ import annotations

import os
import signal
import sys

INTERRUPTED = ("error: interrupted outside the training loop; the newest checkpoint in the run dir, if any, "
               "is the resume point")
STATUS = 130  # 128 + SIGINT, as a shell reports a process ended by Ctrl-C


def exit_on_interrupt() -> None:
    """Make SIGINT print `INTERRUPTED` and exit with `STATUS` (main thread only)."""
    signal.signal(signal.SIGINT, _interrupted)


def _interrupted(_signum: int, _frame: object) -> None:
    try:
        sys.stdout.flush()
    except (OSError, ValueError):  # a closed or broken stdout: the line below still goes out
        pass
    os.write(2, (INTERRUPTED + "\n").encode())
    os._exit(STATUS)
