"""`python -m jaxrl_async.train [overrides]`: one async RL run (docs/design.md §5, §8).

Hydra composes `conf/train.yaml` (groups: model, task, policy, engine, trainer, cluster; the
top-level keys are `RunConfig`'s). The generation engine is `engine=jax` (in-process) or
`engine=vllm` (vLLM's own processes); `cluster=ray` puts that engine into Ray actors behind one
`RayEngineProxy` whose lost requests go to the planner's fault path; `cluster.distributed` (any
mode) joins a multi-host JAX job before the first JAX use, and `trainer.mesh` / `engine.replicas`,
`engine.tensor_parallel`, `engine.colocate` place the trainer and the engines on devices
(cluster/placement.py; docs/scale_out.md). This module composes, types, runs and sets the exit
status; the run itself is jaxrl_async/job/: `typed_config` (setup.py) turns the composed config
into typed, validated objects once, before Hydra makes the run directory (planner/tools/entry.py)
— a bad value or an unknown key is a one-line error naming it and exit status 1 — and `TrainJob` (lifecycle.py) builds the components
(build.py), runs the `Controller`, and ends the run (report.py):

    run_dir/ledger.jsonl     every admit/start/train/drop/move (the proof; planner.audit reads it)
    run_dir/metrics.jsonl    one record per step;  run_dir/tb/ the same in TensorBoard
    run_dir/trace.jsonl      the timing trace: groups, steps, pushes, engine iterations
                             (planner/run_trace.py; `python -m planner.calibrate` fits it)
    run_dir/summary.json     docs/design.md §8 keys (+ extensions, + the audit's verdict)
    run_dir/checkpoints/     orbax (after step 1, every `checkpoint_every` steps, on SIGTERM or
                             SIGINT, at the end)
    run_dir/hf/              the final policy as HF safetensors (export_hf)
    run_dir/run.lock         held by the run that owns the directory (jaxrl_async/run_dir.py)

In a job of several processes only process 0 writes these; the others follow it in lockstep.

and prints the audit's verdict: max staleness vs η, drops, lost and twice-trained groups. Exit
status: 0 when the run finished and the audit passed; 128 + the signal (130 SIGINT, 143 SIGTERM)
when a signal stopped it — checkpointed, with its `resume=` line — or reached it while it ended
(it still finishes), so that `train && eval` never evaluates a stopped run; 1 otherwise.
`resume=true` (with `hydra.run.dir=DIR`) or `resume=DIR` continues the run in DIR from its newest
whole checkpoint (a damaged one — its manifest's sizes or checksums do not match, or it does not
restore — is set aside with one warning line and the next older one is used): same ledger, same
metrics, the step count continues; `steps=` equal to the steps already trained finishes a run
killed after its final checkpoint (export, audit, summary). A run that never saved one starts
afresh, its files set aside; `resume=DIR` where DIR holds no run is an error, `resume=true` on a
directory without one starts a fresh run there (job/resume.py). Ctrl-C before the training loop is
one line and exit status 130 (cli/interrupt.py). What survives a kill, what a resume checks:
docs/fault_tolerance.md.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

from omegaconf import DictConfig

from jaxrl_async.cli.help import CONF_DIR, help_spec
from jaxrl_async.cli.interrupt import INTERRUPTED, STATUS, exit_on_interrupt
from planner.tools.entry import Command, hydra_main

# The job's modules import JAX: they are imported where the run starts, so that `--help` (answered
# by `hydra_main` before anything runs) stays free of it (tests/jaxrl_async/cli/test_train.py).


def _main(cfg: DictConfig) -> None:
    for name in ("absl", "jax._src.xla_bridge"):  # orbax logs every save, JAX its backend probes
        logging.getLogger(name).setLevel(logging.WARNING)
    from hydra.core.hydra_config import HydraConfig

    from jaxrl_async.checkpoint import CheckpointWriteError
    from jaxrl_async.job.lifecycle import TrainJob
    from jaxrl_async.job.report import final_report
    from jaxrl_async.job.resume import run_dir_for
    from jaxrl_async.job.setup import typed_config

    started = time.monotonic()
    try:
        setup = typed_config(cfg)
        job = TrainJob(setup, run_dir_for(setup, HydraConfig.get().runtime.output_dir))
        # Engines start inside the run: an unreachable Ray cluster or unplaceable workers fail here.
        out = job.run()
    except CheckpointWriteError as e:
        # The run's files are closed; what orbax left of the failed save may still wait on its
        # own threads (docs/fault_tolerance.md), so the process ends here without joining them.
        print(f"error: {e}", file=sys.stderr)
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)
    except (ValueError, ConnectionError) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)
    except OSError as e:  # a disk that fails outside a checkpoint (the ledger, metrics): names the file
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)
    except KeyboardInterrupt:  # Ctrl-C outside the training loop when `main` is called without `run`
        print(INTERRUPTED, file=sys.stderr)
        sys.exit(STATUS)
    if out is None:  # a follower process: process 0 reports the run
        return
    print(final_report(out, job.run_dir / "metrics.jsonl"))
    print(f"wall time {time.monotonic() - started:.0f}s")
    if job.signalled is not None:  # a shell's status for a process a signal ended: the chain stops
        sys.exit(128 + job.signalled)
    if out.get("completed") and not out["audit_ok"]:
        sys.exit(1)


def main(before_run: Callable[[], None] | None = None) -> None:
    """`before_run`: called once the command line is no `--help` (the compilation cache)."""
    # register: the dataclass defaults every conf/ file starts from; typed: bad input fails before Hydra's run dir
    command = Command(CONF_DIR, "train", help_spec("python -m jaxrl_async.train", "one async RL run (docs/design.md §5, §8)"),
                      _register_config_nodes, _typed, _check_run_dir)
    hydra_main(command, _main, before_run=before_run)


def _register_config_nodes() -> None:
    from omegaconf import OmegaConf

    from jaxrl_async.cli.config_nodes import register_config_nodes

    register_config_nodes()
    # conf/train.yaml's hydra.run.dir: `resume=PATH`'s PATH, so that a resume makes no new folder
    OmegaConf.register_new_resolver("resume_dir", _resume_dir, replace=True)


def _resume_dir(resume: bool | str | None, default: str) -> str:
    return resume if isinstance(resume, str) else default


def _typed(cfg: DictConfig, _overrides: list[str]):
    """Typed and checked (job/preflight.py) before Hydra makes its run directory: a rejected
    command leaves nothing behind. The devices are checked here in a one-process job only (a
    multi-host job joins first: TrainJob checks them then, before it locks the directory)."""
    from jaxrl_async.cluster.distributed import resolve
    from jaxrl_async.job.preflight import check_start
    from jaxrl_async.job.setup import typed_config

    setup = typed_config(cfg)
    check_start(setup, devices=resolve(setup.cluster.distributed, os.environ) is None)
    return setup


def _check_run_dir(setup, hydra_dir: Path) -> None:
    """Refuse, before Hydra writes `.hydra/` into it, a run directory another run owns: one whose
    lock a live run holds (jaxrl_async/run_dir.py), or one that holds a run and no resume was
    asked for, or a `resume=PATH` without a run (job/resume.py). TrainJob checks again (a run
    can start in between); these only move the refusal before Hydra's writes."""
    from jaxrl_async.cluster.distributed import resolve
    from jaxrl_async.job.resume import check_resume_target, run_dir_for, start_resuming
    from jaxrl_async.run_dir import RunDirLock

    run_dir = run_dir_for(setup, hydra_dir).absolute()
    check_resume_target(run_dir, setup.run.resume)
    init = resolve(setup.cluster.distributed, os.environ)
    if init is not None and init.process_id != 0:
        return  # a follower: process 0 owns the directory, its lock and its refusal
    RunDirLock(run_dir).check_free()
    if not setup.run.resume:
        start_resuming(run_dir, setup.run.resume, leader=True)  # the refusal only (writes nothing)


def _compilation_cache() -> None:
    from jaxrl_async.compilation_cache import enable_compilation_cache

    enable_compilation_cache()


def run() -> None:
    """`python -m` entry (this module's and the jaxrl_async/train.py shim's): Ctrl-C outside the
    training loop as one line and exit status 130 (cli/interrupt.py), the on-disk compilation
    cache (after the `--help` check), then `main`. Library code and tests call `main` and turn
    neither on."""
    exit_on_interrupt()
    main(before_run=_compilation_cache)


if __name__ == "__main__":
    run()
