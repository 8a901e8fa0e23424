"""Every component of a training run, built in the order that fails fastest (`build_components`),
and the run's generation engine (`make_generation_engine`).

Order: the task first (a bad dataset line fails before minutes of compilation), the model, the
placement of the trainer and the engines (the engine's registry entry plans it), the engine
before the trainer (which donates its params every step) — with one warning line for each tail
key that cannot act on it (job/tail_keys.py) —, the checkpointer, the restored state
on a resume, and — on process 0 only — the controller with its ledger, sinks and trace. In a job
of several JAX processes every other process builds only the model, its shard of the trainer
and the checkpointer, and follows process 0 (jaxrl_async/cluster/lockstep.py).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from jaxrl_async.checkpoint import Checkpointer
from jaxrl_async.cluster.lockstep import CommandChannel, LeaderCheckpointer, LeaderTrainer, lead
from jaxrl_async.cluster.placement import Placement, plan_placement
from jaxrl_async.engines.base import GenerationEngine
from jaxrl_async.engines.registry import build_engine
from jaxrl_async.envs.engine import play_episodes
from jaxrl_async.runtime.samples import SampleLog
from jaxrl_async.envs.task import EpisodeContext
from jaxrl_async.engines.replicated import ReplicatedEngine
from jaxrl_async.job.report import trace_meta
from jaxrl_async.job.resume import restore, run_meta
from jaxrl_async.job.setup import TrainSetup
from jaxrl_async.job.tail_keys import inert_keys, tail_keys
from jaxrl_async.models.loading import LoadedModel, load_model
from jaxrl_async.runtime.controller import Controller
from jaxrl_async.runtime.metrics import METRICS_FILE, JsonlSink, TensorBoardSink
from jaxrl_async.runtime.progress import ProgressDisplay
from jaxrl_async.tasks import build_task
from jaxrl_async.tasks.base import Example, Task
from jaxrl_async.trainer.trainer import Trainer
from planner.ledger import LEDGER_FILE, LedgerWriter
from planner.registry import make_policy
from planner.sim.recorder import EventRecorder
from planner.run_trace import TRACE_FILE, TraceWriter
from planner.types import PlanContext

log = logging.getLogger(__name__)

@dataclass
class Components:
    """What `build_components` made; `controller` and `recorder` exist on process 0 only."""

    task: Task
    eval_examples: list[Example]  # the held-out prompts of `eval.every` (none without it)
    loaded: LoadedModel
    placement: Placement
    channel: CommandChannel | None  # process 0 -> the others; None in a one-process job
    trainer: Trainer | LeaderTrainer  # process 0 of a multi-process job: the lockstep leader's wrapper
    checkpointer: Checkpointer | LeaderCheckpointer
    meta: dict[str, Any] | None = None  # the restored checkpoint's meta (None: a fresh run)
    controller: Controller | None = None
    recorder: EventRecorder | None = None


def build_components(setup: TrainSetup, run_dir: Path, *, leader: bool, resuming: bool) -> Components:
    run = setup.run
    task = build_task(setup.task)
    # eval.every needs a held-out split: a task without one fails here, before compiling.
    eval_examples = task.test_examples()[: run.eval.prompts] if run.eval.every else []
    loaded = load_model(setup.model.source, dtype=setup.model.dtype, adapter=setup.model.adapter)
    if loaded.tokenizer is None:
        raise ValueError(f"model.source={setup.model.source!r}: has no tokenizer (tokenizer.json)")
    placement = plan_run_placement(setup)
    channel = CommandChannel() if placement.processes > 1 else None
    holder: list[Controller] = []  # the engine reports lost requests to the controller built below
    engine = make_generation_engine(setup, loaded, placement,
                                    on_lost=lambda ids: holder[0].on_requests_lost(ids)) if leader else None
    for line in inert_keys(setup, engine) if leader else ():  # a tail key that cannot act says so, once
        log.warning(line)
    trainer = Trainer(loaded.model, setup.trainer, mesh=placement.trainer_mesh)
    checkpointer = Checkpointer(run_dir, keep=run.keep_checkpoints, every=run.checkpoint_every)
    meta = restore(checkpointer, trainer, setup, task, run_dir, leader=leader) if resuming else None
    if channel is not None and leader:
        trainer, checkpointer = lead(trainer, checkpointer, channel)
    parts = Components(task, eval_examples, loaded, placement, channel, trainer, checkpointer, meta)
    if leader:
        parts.controller, parts.recorder = build_controller(setup, parts, engine, run_dir, resuming)
        holder.append(parts.controller)
    return parts


def plan_run_placement(setup: TrainSetup) -> Placement:
    """The trainer's mesh and, for an engine this process places, the replicas' meshes."""
    if not setup.engine_in_process:  # the cluster's workers place their own engines
        return plan_placement(setup.trainer.mesh)
    return setup.engine_entry.placement(setup.engine, setup.trainer.mesh)


def build_controller(setup: TrainSetup, parts: Components, engine: GenerationEngine | None, run_dir: Path,
                     resuming: bool) -> tuple[Controller, EventRecorder | None]:
    """Process 0's controller over the built components, appending to the logs on a resume."""
    run, loaded, task = setup.run, parts.loaded, parts.task
    tokenizer = loaded.tokenizer
    stream = task.make_stream(tokenizer, loaded.chat_template, seed=run.seed)
    ctx = PlanContext(run.batch_groups, run.group_size, run.max_staleness, run.steps)
    policy = make_policy(setup.policy_name, ctx, setup.policy_overrides)
    recorder = EventRecorder() if run.record_events else None
    driven = recorder.wrap(policy) if recorder is not None else policy
    ledger = LedgerWriter(run_dir / LEDGER_FILE, append=resuming, buffer_lines=256)
    sinks: list = [JsonlSink(run_dir / METRICS_FILE, append=resuming)]
    if run.tensorboard:
        sinks.append(TensorBoardSink(run_dir / "tb"))
    if run.progress != "off":
        tail = tail_keys(setup)  # the progress line shows the counts of the tail's features that are on
        sinks.append(ProgressDisplay(total_steps=run.steps, policy=setup.policy_name, max_staleness=run.max_staleness,
                                     mode=run.progress, speculation=tail.speculation is not None,
                                     migration=tail.migrate))
    stop_ids = loaded.stop_token_ids
    if task.multi_turn:  # each sample an episode, its turns played over the engine (envs/engine.py)
        engine = play_episodes(engine, task, EpisodeContext(tokenizer, tuple(stop_ids)), setup.engine)
    encode = task.encoder(tokenizer, loaded.chat_template)  # the held-out prompts, as training's
    controller = Controller(
        run, policy=driven, engine=engine, trainer=parts.trainer, task=task, tokenizer=tokenizer,
        stream=stream, ledger=ledger, run_dir=run_dir, sinks=sinks, checkpointer=parts.checkpointer,
        stop_token_ids=stop_ids, engine_dtype=loaded.cfg.dtype,
        run_config_meta=run_meta(setup, task), eval_prompts=list(map(encode, parts.eval_examples)),
        trace=TraceWriter(run_dir / TRACE_FILE, append=resuming),
        trace_meta=trace_meta(setup, parts.placement),
        samples=SampleLog(run_dir, run.samples_per_step, tokenizer, append=resuming))
    if parts.meta is not None:
        controller.load_checkpoint_meta(parts.meta)
    return controller, recorder


def make_generation_engine(setup: TrainSetup, loaded: LoadedModel, placement: Placement,
                           on_lost: Callable[[list[str]], None]) -> GenerationEngine:
    """The run's `GenerationEngine`: `setup.engine`'s backend from the engine registry, in this
    process — one engine per replica mesh of `placement` (several behind a `ReplicatedEngine`),
    or the model as loaded for a backend that places itself — or in the cluster's workers
    (cluster=ray), whose lost requests go to `on_lost(request_ids)` (the controller's fault path)."""
    if not setup.engine_in_process:
        # Workers load the model themselves (a registered name or a path they can read): the
        # version-0 weights are the same as the trainer's (seeded init or the same files).
        source = setup.model.source
        if Path(source).exists():
            source = str(Path(source).absolute())
        return setup.cluster.remote_engine(setup.engine_name, dataclasses.asdict(setup.engine), source,
                                           setup.model.dtype, on_lost)
    if setup.engine_facts.places_itself:  # e.g. vLLM: takes the model as loaded
        return build_engine(setup.engine_name, setup.engine, loaded)
    # The trainer donates its params every step: each replica gets its own copy.
    graphdef, state = nnx.split(loaded.model)
    engines = [build_engine(setup.engine_name, setup.engine, dataclasses.replace(
        loaded, model=nnx.merge(graphdef, jax.tree.map(jnp.copy, state))), mesh=mesh)
        for mesh in placement.engine_meshes]
    if len(engines) == 1:
        return engines[0]
    return ReplicatedEngine(engines)
