"""The command lines: one module each, composing `conf/` and setting the exit status.

- `train.py`: `python -m jaxrl_async.train` — compose, type, run a `job.TrainJob`, exit status.
- `eval.py`, `generate.py`: the one-shot commands (`python -m jaxrl_async.eval` / `.generate`).
- `common.py`: what the one-shot commands share (compose, one-line errors, status lines).
- `config_nodes.py`: the dataclass defaults every `conf/` file starts from.

`jaxrl_async/train.py`, `eval.py` and `generate.py` only forward `python -m` to these, so the
documented commands stay as they are. Nothing outside cli/ imports a command.
"""
