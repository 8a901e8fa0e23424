"""One training run, in the order it happens (the command line is jaxrl_async/cli/train.py):

- `setup.py`: `TrainSetup`, the typed config (`typed_config`), and the facts derived from it.
- `preflight.py`: the typed run checked against its data, model and devices, before anything is written.
- `resume.py`: whether the run continues an earlier one, and whether that one is compatible.
- `build.py`: every component (task, model, placement, engine, trainer, checkpointer, controller).
- `lifecycle.py`: `TrainJob` — lock, lead or follow, signals, the end of the run.
- `report.py`: summary.json (audit, placement), the trace's `run` line, the HF export, the report.

Backends and cluster modes state their own facts (engines/registry.py, cluster/config.py);
nothing here branches on their names.
"""
