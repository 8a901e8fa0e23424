"""`check_start`: what a typed run (job/setup.py) is checked against before anything is written.

`typed_config` checks each key alone; this checks the keys against what they name, so that a
rejected command leaves no run directory, lock or `outputs/` folder behind:

- the task: its data is read (a missing `task.path`, a bad line) and, with `eval.every`, its
  held-out split;
- the model: `model.source` names a registered model, a HF directory or a .gguf file, whose
  config is read without its weights (models/loading.py `model_config`);
- the engine against that model (engines/registry.py `EngineEntry.check_model`: e.g. a draft of
  more layers than the policy has);
- LoRA against that model: `trainer.lora.rank` no larger than a target's smaller dimension, and a
  `model.adapter` that fits it (models/peft_adapter.py);
- the devices (`devices=True`): the trainer's mesh and the engine's replicas fit this job's
  devices (cluster/placement.py, whose error says how a CPU gets more).

It runs twice: in the command, before Hydra makes its run directory (cli/train.py), where the
devices are checked in a one-process job only — a multi-host job must join before any JAX device
is touched (cluster/distributed.py) — and in `TrainJob` (job/lifecycle.py), after the join and
before the run directory is locked or made. Each check is cheap next to the run's build
(job/build.py), which makes all of these again.
"""

from __future__ import annotations

from jaxrl_async.job.build import plan_run_placement
from jaxrl_async.job.setup import TrainSetup
from jaxrl_async.models.loading import model_config
from jaxrl_async.models.peft_adapter import check_adapter_dir
from jaxrl_async.models.transformer import layer_shapes
from jaxrl_async.tasks import build_task
from jaxrl_async.trainer.trainer import check_lora_rank


def check_start(setup: TrainSetup, *, devices: bool) -> None:
    """A one-line ValueError naming the key for the first check of the module docstring that fails."""
    task = build_task(setup.task)
    task.examples()
    if setup.run.eval.every:
        task.test_examples()
    cfg = model_config(setup.model.source)
    setup.engine_entry.check_model(setup.engine, cfg)
    if setup.trainer.lora.enabled:
        check_lora_rank(setup.trainer, layer_shapes(cfg))
    if setup.model.adapter is not None:
        check_adapter_dir(setup.model.adapter, cfg)
    if devices:
        plan_run_placement(setup)
