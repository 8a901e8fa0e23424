"""`python -m jaxrl_async.train [overrides]`: one async RL run (docs/design.md §5, §8).

Hydra composes `conf/train.yaml` (groups: model, task, policy, engine, trainer, cluster; the
top-level keys are `RunConfig`'s). The generation engine is `engine=jax` (in-process) or
`engine=vllm` (vLLM's own processes); `cluster=ray` puts that engine into Ray actors behind one
`RayEngineProxy` whose lost requests go to the planner's fault path; `cluster.distributed` (any
mode) joins a multi-host JAX job before the first JAX use, and `trainer.mesh` / `engine.replicas`,
`engine.tensor_parallel`, `engine.colocate` place the trainer and the engines on devices
(cluster/placement.py; docs/scale_out.md). `typed_config` turns the composed config into typed,
validated objects once; a bad value is a one-line error and exit status 1, an unknown key is Hydra's own
error. `TrainJob` builds the components, runs the `Controller`, and ends the run:

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
status: 0 when the run finished and the audit passed (or the run stopped on SIGTERM / SIGINT with
a checkpoint), 1 otherwise. `resume=true` (with `hydra.run.dir=DIR`) or `resume=DIR` continues the
run in DIR from its newest checkpoint: same ledger, same metrics, the step count continues; a run
that never saved one starts afresh, its files set aside. What survives a kill, what a resume
checks: docs/fault_tolerance.md.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

GROUPS = ("model", "task", "policy", "engine", "trainer", "cluster")
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TrainSetup:
    """Everything a run needs, typed and validated; built once by `typed_config`."""

    run: Any  # RunConfig
    model: Any  # models.loading.ModelSpec
    task: dict[str, Any]  # checked by `build_task`
    policy_name: str
    policy_overrides: dict[str, Any]  # native parameters that are not null
    engine_name: str  # a name in engines/registry.py ENGINES
    engine: Any  # its config: EngineConfig (jax) | VllmEngineConfig (vllm)
    trainer: Any  # TrainerConfig
    cluster: Any  # ClusterConfig


def typed_config(cfg: DictConfig | Mapping[str, Any]) -> TrainSetup:
    """The composed config -> `TrainSetup`; every problem is a one-line ValueError."""
    from jaxrl_async.cluster.config import cluster_config
    from jaxrl_async.engines.registry import ENGINES, engine_config
    from jaxrl_async.models.loading import ModelSpec
    from jaxrl_async.runtime.config import RunConfig
    from jaxrl_async.trainer.config import TrainerConfig
    from planner.configs import build
    from planner.registry import given_params, make_policy
    from planner.types import PlanContext

    plain = OmegaConf.to_container(cfg, resolve=True) if isinstance(cfg, DictConfig) else dict(cfg)
    plain.pop("hydra", None)
    missing = [g for g in GROUPS if not isinstance(plain.get(g), dict)]
    if missing:
        raise ValueError(f"{missing[0]}: config group missing (choose one with {missing[0]}=NAME)")
    groups = {g: dict(plain.pop(g)) for g in GROUPS}
    run = build(RunConfig, plain, "")
    cluster = cluster_config(groups["cluster"])
    model = build(ModelSpec, groups["model"], "model")
    policy = groups["policy"]
    name = policy.pop("name", None)
    if not isinstance(name, str):
        raise ValueError(f"policy.name={name!r}: every conf/policy/*.yaml names its policy")
    overrides = given_params(policy)  # ??? in conf/policy: not given (the default); null is a value
    # Built once here so that an unknown policy or a bad native parameter fails at start-up.
    make_policy(name, PlanContext(run.batch_groups, run.group_size, run.max_staleness, run.steps), overrides)
    engine_values = groups["engine"]
    engine_name = engine_values.pop("name", "jax")
    engine = engine_config(engine_name, engine_values)
    entry = ENGINES[engine_name]
    if entry.package is not None:
        _require_package(entry.package, f"engine={engine_name}", entry.install)
    slots_key, slots = entry.slots_key, getattr(engine, entry.slots_key)
    if cluster.name == "ray":
        _require_package("ray", "cluster=ray", "pip install -e '.[ray]'")
        if getattr(engine, "replicas", 1) != 1:
            raise ValueError(f"engine.replicas={engine.replicas}: with cluster=ray every Ray worker is one replica; "
                             "set cluster.num_workers instead")
    if slots < run.group_size:
        raise ValueError(f"engine.{slots_key}={slots}: must be >= group_size={run.group_size} "
                         "(a group's samples are decoded together)")
    trainer = build(TrainerConfig, groups["trainer"], "trainer")
    return TrainSetup(run, model, groups["task"], name, overrides, engine_name, engine, trainer, cluster)


def _require_package(module: str, what: str, fix: str) -> None:
    """A missing optional backend is a one-line error at start-up, not an ImportError mid-run."""
    import importlib.util

    if importlib.util.find_spec(module) is None:
        raise ValueError(f"{what}: the {module!r} package is not installed in {sys.executable} ({fix})")


class TrainJob:
    """Builds every component for `setup` in `run_dir` (resuming when asked) and runs it.

    In a job of several JAX processes (docs/scale_out.md) process 0 builds everything and leads;
    every other process builds only the model, the trainer's shard of the mesh and the
    checkpointer, and follows process 0's collective calls (jaxrl_async/cluster/lockstep.py).
    """

    def __init__(self, setup: TrainSetup, run_dir: str | Path) -> None:
        import jax

        from jaxrl_async.cluster.distributed import initialize_distributed
        from jaxrl_async.run_dir import RunDirLock

        self.setup = setup
        self.run_dir = Path(run_dir).absolute()
        # Before anything touches a device: after it, jax.devices() spans every process.
        initialize_distributed(setup.cluster.distributed)
        self.leader = jax.process_index() == 0
        # Process 0 owns the directory from here to the run's end: a second run on it stops here.
        self._lock = RunDirLock(self.run_dir) if self.leader else None
        if self._lock is not None:
            self._lock.acquire()
        self._stopping = False
        self._loop_over = False  # the controller has returned: a first signal only lets the end finish
        try:
            self._build(setup)
        except BaseException:
            self.release()
            raise

    def release(self) -> None:
        """Give up the run directory (at the run's end; the OS does it when the process dies)."""
        if self._lock is not None:
            self._lock.release()

    def _build(self, setup: TrainSetup) -> None:
        from jaxrl_async.checkpoint import Checkpointer, TreeMismatch, truncate
        from jaxrl_async.cluster.placement import plan_placement
        from jaxrl_async.models.loading import load_model
        from jaxrl_async.run_dir import set_aside
        from jaxrl_async.runtime.metrics import METRICS_FILE
        from jaxrl_async.tasks import build_task
        from jaxrl_async.trainer.trainer import Trainer
        from planner.ledger import LEDGER_FILE
        from planner.tools.run_trace import TRACE_FILE

        run = setup.run
        resuming = bool(run.resume)
        if self.leader and not resuming and (self.run_dir / LEDGER_FILE).exists():
            raise ValueError(f"hydra.run.dir={self.run_dir}: already holds a run; pass resume=true to continue it "
                             "(or to start it afresh if it never saved a checkpoint) or choose another hydra.run.dir")
        self.run_dir.mkdir(parents=True, exist_ok=True)
        if resuming and Checkpointer(self.run_dir).latest_step() is None:
            # Killed before its first save: nothing to continue. Every process decides alike.
            resuming = False
            where = set_aside(self.run_dir) if self.leader else None
            if self.leader:
                log.warning("resume: no checkpoint in %s (the run stopped before its first save); starting afresh%s",
                            self.run_dir / "checkpoints",
                            f", the earlier attempt's files are in {where}" if where else "")
        self.resumed = resuming

        # Data first: a bad dataset line must fail before minutes of compilation.
        self.task = build_task(setup.task)
        # eval.every needs a held-out split: a task without one fails here, before compiling.
        self.eval_examples = self.task.test_examples()[: run.eval.prompts] if run.eval.every else []
        self.loaded = load_model(setup.model.source, dtype=setup.model.dtype)
        if self.loaded.tokenizer is None:
            raise ValueError(f"model.source={setup.model.source!r}: has no tokenizer (tokenizer.json)")
        engine = setup.engine if setup.engine_name == "jax" and setup.cluster.name != "ray" else None
        self.placement = plan_placement(
            setup.trainer.mesh, replicas=getattr(engine, "replicas", 1),
            tensor_parallel=getattr(engine, "tensor_parallel", 1), colocate=getattr(engine, "colocate", True))
        self.channel = None
        if self.placement.processes > 1:
            from jaxrl_async.cluster.lockstep import CommandChannel

            self.channel = CommandChannel()

        # The engine is built before the trainer, which donates its params every step.
        self._engine = make_generation_engine(
            setup, self.loaded, self.placement,
            on_lost=lambda ids: self.controller.on_requests_lost(ids)) if self.leader else None
        self.trainer = Trainer(self.loaded.model, setup.trainer, mesh=self.placement.trainer_mesh)
        self.checkpointer = Checkpointer(self.run_dir, keep=run.keep_checkpoints, every=run.checkpoint_every)

        self._meta = None
        if resuming:  # every process restores its shards of the trainer state
            changes = _check_compatible(self.checkpointer.read_meta(), _run_meta(run, setup, self.task))
            if changes and self.leader:
                log.warning("resume: settings changed since the checkpoint: %s", "; ".join(changes))
            try:
                trainer_state, self._meta = self.checkpointer.restore(self.trainer.state_dict())
            except TreeMismatch as e:
                raise ValueError(f"resume: model.source={setup.model.source!r} does not fit the checkpoint: {e}; "
                                 "resume with the checkpointed run's model") from None
            self.trainer.load_state_dict(trainer_state)
            if self.leader:
                truncate(self.run_dir / LEDGER_FILE, self._meta["ledger_bytes"])
                truncate(self.run_dir / METRICS_FILE, self._meta["metrics_bytes"])
                if self._meta.get("trace_bytes") is not None:  # older checkpoints: no trace
                    truncate(self.run_dir / TRACE_FILE, self._meta["trace_bytes"])
        if self.channel is not None and self.leader:
            from jaxrl_async.cluster.lockstep import lead

            self.trainer, self.checkpointer = lead(self.trainer, self.checkpointer, self.channel)
        if self.leader:
            self._build_controller(resuming)

    def _build_controller(self, resuming: bool) -> None:
        from jaxrl_async.runtime.controller import Controller
        from jaxrl_async.runtime.metrics import METRICS_FILE, JsonlSink, TensorBoardSink
        from jaxrl_async.runtime.progress import ProgressDisplay
        from planner.ledger import LEDGER_FILE, LedgerWriter
        from planner.registry import make_policy
        from planner.sim.recorder import EventRecorder
        from planner.tools.run_trace import TRACE_FILE, TraceWriter
        from planner.types import PlanContext

        setup, run, tokenizer = self.setup, self.setup.run, self.loaded.tokenizer
        stream = self.task.make_stream(tokenizer, self.loaded.chat_template, seed=run.seed)
        ctx = PlanContext(run.batch_groups, run.group_size, run.max_staleness, run.steps)
        policy = make_policy(setup.policy_name, ctx, setup.policy_overrides)
        self.recorder = EventRecorder() if run.record_events else None
        driven = self.recorder.wrap(policy) if self.recorder is not None else policy
        ledger = LedgerWriter(self.run_dir / LEDGER_FILE, append=resuming, buffer_lines=256)
        sinks: list = [JsonlSink(self.run_dir / METRICS_FILE, append=resuming)]
        if run.tensorboard:
            sinks.append(TensorBoardSink(self.run_dir / "tb"))
        if run.progress != "off":
            sinks.append(ProgressDisplay(total_steps=run.steps, policy=setup.policy_name,
                                         max_staleness=run.max_staleness, mode=run.progress))
        stop_ids = tuple(dict.fromkeys((*self.loaded.cfg.eos_token_ids, *tokenizer.eos_token_ids)))
        encode = self.task.encoder(tokenizer, self.loaded.chat_template)  # the held-out prompts, as training's
        self.controller = Controller(
            run, policy=driven, engine=self._engine, trainer=self.trainer, task=self.task, tokenizer=tokenizer,
            stream=stream, ledger=ledger, run_dir=self.run_dir, sinks=sinks, checkpointer=self.checkpointer,
            stop_token_ids=stop_ids, engine_dtype=self.loaded.cfg.dtype,
            run_config_meta=_run_meta(run, self.setup, self.task), eval_prompts=list(map(encode, self.eval_examples)),
            trace=TraceWriter(self.run_dir / TRACE_FILE, append=resuming),
            trace_meta=trace_meta(self.setup, self.placement))
        if self._meta is not None:
            self.controller.load_checkpoint_meta(self._meta)

    async def _run(self):
        loop = asyncio.get_running_loop()
        if self.setup.cluster.name == "ray":
            from jaxrl_async.cluster.ray import connect

            # ray.init installs its own SIGTERM handler (exit at once, no checkpoint): join Ray
            # first, so that the handlers below replace it rather than the other way round.
            connect(self.setup.cluster.ray)
        installed = []
        for sig in (signal.SIGTERM, signal.SIGINT):
            try:
                loop.add_signal_handler(sig, self._on_signal, sig)
                installed.append(sig)
            except (RuntimeError, ValueError):  # not the main thread: the caller handles signals
                pass
        try:
            return await self.controller.run()
        finally:
            self._loop_over = True
            for sig in installed:
                loop.remove_signal_handler(sig)
                # The final save, the export and the audit still run: a signal there keeps the
                # same meaning (the first lets them finish, a second exits at once).
                signal.signal(sig, lambda sig, _frame: self._on_signal(sig))

    def _on_signal(self, sig: int) -> None:
        """The first SIGTERM / SIGINT stops the run at the next step boundary with a checkpoint; a
        second one exits at once (the logs are durable up to the last step, the checkpoint is the
        last one finished)."""
        name = signal.Signals(sig).name
        if self._stopping:
            log.warning("%s again: exiting now without a checkpoint (resume=%s continues from the last one)",
                        name, self.run_dir)
            os._exit(128 + sig)
        self._stopping = True
        if self._loop_over:
            log.warning("%s: the run has stopped; finishing its checkpoint and report (%s again exits at once)",
                        name, name)
            return
        log.warning("%s: stopping at the next step boundary with a checkpoint (%s again exits at once)", name, name)
        self.controller.request_stop()

    def run(self) -> dict[str, Any] | None:
        """Run to the end (or to a stop); returns the summary (with the audit's fields when it
        ended). A follower process returns None once process 0 ends the job."""
        if not self.leader:
            return self._follow()
        main = threading.current_thread() is threading.main_thread()
        handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)} if main else {}
        try:
            return self._lead()
        finally:
            if self.channel is not None:
                self.channel.send("stop")
            self.release()
            for sig, handler in handlers.items():
                signal.signal(sig, handler)

    def _follow(self) -> None:
        from jaxrl_async.cluster.lockstep import follow

        # Process 0 decides when the job stops (it checkpoints first); a signal here only says so.
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: logging.getLogger(__name__).warning(
                "signal received: process 0 stops the job (send it SIGTERM)"))
        follow(self.trainer, self.checkpointer, self.channel)
        return None

    def _lead(self) -> dict[str, Any]:
        from jaxrl_async.runtime.metrics import METRICS_FILE, SUMMARY_FILE, record_times, summary, write_json
        from planner.tools.audit import audit, audited_bound

        try:
            result = asyncio.run(self._run())
        finally:
            self.controller.ledger.close()
            self.controller.trace.close()
            for sink in self.controller.sinks:
                sink.close()
            if self.recorder is not None:
                self.recorder.dump(self.run_dir / "policy_events.jsonl")
            self.checkpointer.close()  # the last save is on disk (or its disk error raises here)
        run = self.setup.run
        bound = self.controller.policy.staleness_bound()
        extra: dict[str, Any] = {"completed": result.completed, "run_dir": str(self.run_dir),
                                 "placement": self.placement_summary()}
        if self.controller.last_eval is not None:
            extra["eval"] = self.controller.last_eval
        if result.completed:
            if run.export_hf:
                extra["hf_dir"] = str(self.export_hf())
            report = audit(self.run_dir, audited_bound(run.max_staleness, bound))
            extra.update(audit_ok=report.ok, audit_verdict=report.verdict(), groups_lost=len(report.lost),
                         groups_trained_twice=len(report.trained_twice), length_bias=report.length_bias)
        out = summary(result.stats, policy=self.setup.policy_name, max_staleness=run.max_staleness, staleness_bound=bound,
                      elapsed_s=result.elapsed_s, trainer_busy_s=result.trainer_busy_s,
                      generator_busy_s=result.generator_busy_s,
                      record_s=record_times(self.run_dir / METRICS_FILE), extra=extra)
        write_json(self.run_dir / SUMMARY_FILE, out)
        return out

    def placement_summary(self) -> dict[str, Any]:
        """summary.json's `placement`: counted from the meshes the run built; a Ray or vLLM
        engine places itself, so its entry names the backend and its replicas."""
        out = self.placement.summary()
        setup = self.setup
        if setup.cluster.name == "ray":
            out["engine"] = {"backend": f"ray/{setup.engine_name}", "replicas": setup.cluster.ray.num_workers}
        elif setup.engine_name == "vllm":
            out["engine"] = {"backend": "vllm", "replicas": 1,
                             "tensor_parallel": getattr(setup.engine, "tensor_parallel_size", 1)}
        else:
            out["engine"]["backend"] = "jax"
        return out

    def export_hf(self) -> Path:
        import jax
        import jax.numpy as jnp
        from flax import nnx

        from jaxrl_async.models.hf_weights import save_hf

        dtype = jnp.dtype(self.loaded.cfg.dtype)
        # Host arrays: gathered from every process when the trainer's mesh spans them.
        params = jax.tree.map(lambda x: jnp.asarray(x, dtype) if jnp.issubdtype(x.dtype, jnp.floating)
                              else jnp.asarray(x), self.trainer.host_params())
        model = nnx.merge(self.trainer.graphdef, params)
        return save_hf(model, self.loaded.cfg, self.run_dir / "hf", self.loaded.tokenizer)


def trace_meta(setup: TrainSetup, placement: Any = None) -> dict[str, Any]:
    """The timing trace's `run` line (planner/run_trace.py): the planner's context and what the
    simulator needs of the engine — workers, slots per worker, KV tokens per worker, sync mode, and
    whether it shares the trainer's devices (`colocated`: the in-process JAX engine placed with
    `engine.colocate=true`; other engines place themselves and time no iterations)."""
    from jaxrl_async.engines.registry import ENGINES

    run, engine = setup.run, setup.engine
    workers = setup.cluster.ray.num_workers if setup.cluster.name == "ray" else getattr(engine, "replicas", 1)
    slots = getattr(engine, ENGINES[setup.engine_name].slots_key)
    max_len = getattr(engine, "max_len", None)
    return {"policy": setup.policy_name, "max_staleness": run.max_staleness, "batch_groups": run.batch_groups,
            "group_size": run.group_size, "admission_window": run.window, "max_new_tokens": run.max_new_tokens,
            "engine": setup.engine_name,
            "workers": workers, "slots": slots, "kv_tokens": None if max_len is None else slots * max_len,
            "sync_mode": getattr(engine, "sync_mode", "partial"),
            "colocated": bool(placement is not None and placement.colocate and setup.engine_name == "jax"
                              and setup.cluster.name != "ray")}


def make_generation_engine(setup: TrainSetup, loaded, placement, on_lost):
    """The run's `GenerationEngine`: `setup.engine_name` from the engine registry, in this process
    — for engine=jax one `JaxEngine` per replica mesh of `placement` (several behind a
    `ReplicatedEngine`) — or (cluster=ray) in Ray actors whose lost requests go to
    `on_lost(request_ids)` (the controller's fault path)."""
    if setup.cluster.name == "ray":
        from jaxrl_async.cluster.ray import EngineSpec, RayEngineProxy

        # Workers load the model themselves (a registered name or a path they can read): the
        # version-0 weights are the same as the trainer's (seeded init or the same files).
        source = setup.model.source
        if Path(source).exists():
            source = str(Path(source).absolute())
        spec = EngineSpec(setup.engine_name, dataclasses.asdict(setup.engine), source, setup.model.dtype)
        return RayEngineProxy(spec, setup.cluster.ray, on_lost=on_lost)
    from jaxrl_async.engines.registry import build_engine

    if setup.engine_name != "jax":  # a backend that places itself (vLLM) takes the model as loaded
        return build_engine(setup.engine_name, setup.engine, loaded)
    import jax
    import jax.numpy as jnp
    from flax import nnx

    # The trainer donates its params every step: each replica gets its own copy.
    graphdef, state = nnx.split(loaded.model)
    engines = [build_engine("jax", setup.engine, dataclasses.replace(
        loaded, model=nnx.merge(graphdef, jax.tree.map(jnp.copy, state))), mesh=mesh)
        for mesh in placement.engine_meshes]
    if len(engines) == 1:
        return engines[0]
    from jaxrl_async.engines.replicated import ReplicatedEngine

    return ReplicatedEngine(engines)


# What a resume compares with the checkpoint (docs/fault_tolerance.md, "What a resume checks").
# Refused: the planner's context and the data — the saved policy state, stream position and
# untrained groups mean nothing under another B, n, η, seed, policy or dataset.
REFUSED_CHANGES = ("policy", "batch_groups", "group_size", "max_staleness", "seed", "task_data", "steps")
# Warned: a run may go on with another learning rate or sampling setting, or from a moved model
# directory (a model that does not fit the checkpoint's arrays fails when they are restored).
WARNED_CHANGES = ("model.source", "trainer.optim.lr", "temperature", "top_p", "max_new_tokens", "task")


def _run_meta(run, setup: TrainSetup, task) -> dict[str, Any]:
    """What a resume compares (`REFUSED_CHANGES`, `WARNED_CHANGES`); saved in every checkpoint."""
    return {"policy": setup.policy_name, "batch_groups": run.batch_groups, "group_size": run.group_size,
            "max_staleness": run.max_staleness, "seed": run.seed, "steps": run.steps,
            "task_data": task_fingerprint(task), "model.source": setup.model.source,
            "trainer.optim.lr": setup.trainer.optim.lr, "temperature": run.temperature, "top_p": run.top_p,
            "max_new_tokens": run.max_new_tokens, "task": dict(setup.task)}


def task_fingerprint(task) -> str:
    """A hash of the task's examples (ids, contents, answers): equal iff the data is the same."""
    digest = hashlib.sha256()
    for e in task.examples():
        digest.update(json.dumps([e.prompt_id, e.content, e.answer], sort_keys=True, default=str).encode())
    return digest.hexdigest()[:16]


def _check_compatible(meta: Mapping[str, Any], now: Mapping[str, Any]) -> list[str]:
    """Raise a one-line ValueError for the first refused change; return the warned ones as
    "key: saved -> now". Keys an older checkpoint lacks are not compared."""
    saved = meta["run"]
    for key in REFUSED_CHANGES:
        if key == "steps":
            if meta["step"] >= now["steps"]:
                raise ValueError(f"resume: steps={now['steps']} but the checkpointed run has trained {meta['step']} "
                                 "steps; pass a larger steps= to train on")
        elif key in saved and saved[key] != now[key]:
            what = "the task's data (task.*) differs from" if key == "task_data" else f"{key}={now[key]!r} but"
            had = "the checkpointed run's" if key == "task_data" else f"the checkpointed run has {key}={saved[key]!r}"
            raise ValueError(f"resume: {what} {had}; resume with the same setting")
    return [f"{key}: {saved[key]!r} -> {now[key]!r}" for key in WARNED_CHANGES
            if key in saved and saved[key] != now[key]]


def final_report(out: Mapping[str, Any], metrics_path: Path) -> str:
    """The short report printed at the end of a run."""
    import json

    records = [json.loads(line) for line in metrics_path.read_text().splitlines() if line.strip()]
    rewards = [r["reward_mean"] for r in records]
    head, tail = rewards[:3], rewards[-3:]
    lines = [
        f"run dir: {out['run_dir']}",
        f"policy {out['policy']}, η={out['max_staleness']}: {out['steps']} steps in {out['elapsed_s']:.0f}s "
        f"({out['steps_per_hour']:.0f} steps/h), {out['steps_skipped']} skipped",
    ]
    if rewards:
        lines.append(f"reward: {sum(head) / len(head):.3f} (first {len(head)} steps) -> "
                     f"{sum(tail) / len(tail):.3f} (last {len(tail)})")
    # The held-out figures (eval.every): the first evaluation (the base model) and the last.
    evals = [(r["eval/version"], r["eval/pass_at_1"]) for r in records if r.get("eval/pass_at_1") is not None]
    if evals:
        (v0, p0), (v, p) = evals[0], evals[-1]
        lines.append(f"eval/pass_at_1 (held out): {p0:.3f} (weights v{v0}) -> {p:.3f} (v{v})")
    lines += [
        f"busy: generator {100 * out['generator_busy_fraction']:.0f}%, trainer {100 * out['trainer_busy_fraction']:.0f}%;"
        f" groups: {out['groups_admitted']} admitted, {out['groups_trained']} trained, {out['groups_dropped']} dropped"
        f" ({out['tokens_wasted']} tokens wasted); reward errors: {out['reward_errors']}{_by_kind(out)}",
        f"token staleness: max {out['max_token_staleness']}, mean {out['mean_token_staleness']:.2f}, "
        f"histogram {out['staleness_histogram']}",
    ]
    if out.get("completed"):
        lines.append(out["audit_verdict"])
    else:
        lines.append(f"stopped at step {out['steps']}: resume with resume={out['run_dir']}")
    return "\n".join(lines)


def _by_kind(out: Mapping[str, Any]) -> str:
    """" (timeout 3, ValueError 1)": the final report's reward errors by kind (none: nothing)."""
    kinds = out.get("reward_errors_by_type") or {}
    return f" ({', '.join(f'{k} {n}' for k, n in sorted(kinds.items()))})" if kinds else ""


def run_dir_for(setup: TrainSetup, hydra_dir: str) -> Path:
    resume = setup.run.resume
    return Path(resume) if isinstance(resume, str) else Path(hydra_dir)


def _main(cfg: DictConfig) -> None:
    from hydra.core.hydra_config import HydraConfig

    from jaxrl_async.checkpoint import CheckpointWriteError

    for name in ("absl", "jax._src.xla_bridge"):  # orbax logs every save, JAX its backend probes
        logging.getLogger(name).setLevel(logging.WARNING)
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
    except KeyboardInterrupt:  # Ctrl-C outside the training loop (start-up, export, audit)
        print("error: interrupted outside the training loop; the newest checkpoint in the run dir, if any, "
              "is the resume point", file=sys.stderr)
        sys.exit(130)
    if out is None:  # a follower process: process 0 reports the run
        return
    print(final_report(out, job.run_dir / "metrics.jsonl"))
    print(f"wall time {time.monotonic() - started:.0f}s")
    if out.get("completed") and not out["audit_ok"]:
        sys.exit(1)


def main() -> None:
    import hydra

    from jaxrl_async.config_nodes import register_config_nodes

    register_config_nodes()  # the dataclass defaults every conf/ file starts from
    conf_dir = str(Path(__file__).resolve().parent.parent / "conf")
    hydra.main(version_base="1.3", config_path=conf_dir, config_name="train")(_main)()


if __name__ == "__main__":
    from jaxrl_async.compilation_cache import enable_compilation_cache

    enable_compilation_cache()
    main()
