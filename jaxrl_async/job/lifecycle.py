"""`TrainJob`: one training run from its directory's lock to its summary — who leads, who
follows, and what SIGTERM / SIGINT mean on the way.

- **Start**: refuse a `resume=PATH` that holds no run (before anything is written), join a
  multi-host JAX job (before the first JAX use), check the run against its data, model and
  devices (job/preflight.py: a rejected run leaves no directory or lock), take the run
  directory's lock (process 0), decide whether the run resumes (job/resume.py), build the
  components (job/build.py).
- **Finished on disk**: a run killed after its final checkpoint (at `steps`) resumes with the
  same `steps=` into its end alone — no controller, no step trained — so that its export, audit
  and summary.json are written (job/resume.py `finished`).
- **Lead / follow**: process 0 runs the controller; every other process follows its collective
  calls until it says stop (jaxrl_async/cluster/lockstep.py); a signal there only says so.
- **Signals**: the first SIGTERM / SIGINT stops the run at the next step boundary with a
  checkpoint; a second exits at once (the logs are durable up to the last step, the checkpoint is
  the last one finished). After the controller returns, the first lets the final save, the
  export and the audit finish. Either way `signalled` keeps the first one: the command exits
  with 128 + its number (cli/train.py), so that `train && eval` never goes on with a stopped run. A cluster that runs the engine workers is joined before the
  handlers are installed (`ray.init` installs its own SIGTERM handler, which must lose).
- **End**: close the logs and the checkpointer, export, audit, write summary.json (job/report.py).
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import threading
from pathlib import Path
from typing import Any

import jax

from jaxrl_async import host_memory
from jaxrl_async.cluster.distributed import initialize_distributed
from jaxrl_async.cluster.lockstep import follow
from jaxrl_async.job.build import Components, build_components
from jaxrl_async.job.preflight import check_start
from jaxrl_async.job.report import export_hf, lora_summary, placement_summary, write_summary
from jaxrl_async.job.resume import check_resume_target, finished, start_resuming
from jaxrl_async.job.setup import TrainSetup
from jaxrl_async.run_dir import RunDirLock
from jaxrl_async.runtime.controller import Controller, RunResult

log = logging.getLogger(__name__)
SIGNALS = (signal.SIGTERM, signal.SIGINT)


class TrainJob:
    """Builds every component for `setup` in `run_dir` (resuming when asked) and runs it.

    In a job of several JAX processes (docs/scale_out.md) process 0 builds everything and leads;
    every other process builds only the model, the trainer's shard of the mesh and the
    checkpointer, and follows process 0's collective calls (jaxrl_async/cluster/lockstep.py).
    """

    def __init__(self, setup: TrainSetup, run_dir: str | Path) -> None:
        self.setup = setup
        self.run_dir = Path(run_dir).absolute()
        check_resume_target(self.run_dir, setup.run.resume)
        # Before anything touches a device: after it, jax.devices() spans every process.
        initialize_distributed(setup.cluster.distributed)
        check_start(setup, devices=True)
        self.leader = jax.process_index() == 0
        for line in setup.start_warnings() if self.leader else ():
            log.warning("%s", line)
        # Process 0 owns the directory from here to the run's end: a second run on it stops here.
        self._lock = RunDirLock(self.run_dir) if self.leader else None
        if self._lock is not None:
            self._lock.acquire()
        self._stopping = False
        self.signalled: int | None = None  # the first SIGTERM / SIGINT the run received
        self._loop_over = False  # the controller has returned: a first signal only lets the end finish
        self._adapter_versions: dict[str, Any] | None = None  # the engine's, at the run's end
        try:
            self.resumed = start_resuming(self.run_dir, setup.run.resume, leader=self.leader)
            self.run_dir.mkdir(parents=True, exist_ok=True)
            self.parts: Components = build_components(setup, self.run_dir, leader=self.leader,
                                                      resuming=self.resumed)
        except BaseException:
            self.release()
            raise

    @property
    def controller(self) -> Controller:
        """Process 0's controller (None on the other processes)."""
        return self.parts.controller

    @property
    def trainer(self) -> Any:
        """The trainer (on process 0 of a multi-process job: its lockstep leader)."""
        return self.parts.trainer

    def release(self) -> None:
        """Give up the run directory (at the run's end; the OS does it when the process dies)."""
        if self._lock is not None:
            self._lock.release()

    def run(self) -> dict[str, Any] | None:
        """Run to the end (or to a stop); returns the summary (with the audit's fields when it
        ended). A follower process returns None once process 0 ends the job."""
        if not self.leader:
            return self._follow()
        main = threading.current_thread() is threading.main_thread()
        handlers = {sig: signal.getsignal(sig) for sig in SIGNALS} if main else {}
        try:
            return self._lead()
        finally:
            if self.parts.channel is not None:
                self.parts.channel.send("stop")
            self.release()
            for sig, handler in handlers.items():
                signal.signal(sig, handler)

    def _follow(self) -> None:
        # Process 0 decides when the job stops (it checkpoints first); a signal here only says so.
        for sig in SIGNALS:
            signal.signal(sig, lambda *_: log.warning("signal received: process 0 stops the job (send it SIGTERM)"))
        follow(self.parts.trainer, self.parts.checkpointer, self.parts.channel)
        return None

    async def _run(self):
        loop = asyncio.get_running_loop()
        # ray.init installs its own SIGTERM handler (exit at once, no checkpoint): join the
        # cluster first, so that the handlers below replace it rather than the other way round.
        self.setup.cluster.connect()
        installed = []
        for sig in SIGNALS:
            try:
                loop.add_signal_handler(sig, self._on_signal, sig)
                installed.append(sig)
            except (RuntimeError, ValueError):  # not the main thread: the caller handles signals
                pass
        try:
            result = await self.controller.run()
            # An engine that pins adapters (jax with adapter_versions > 1, vllm with LoRA): the
            # resident versions and what the pushes did.
            self._adapter_versions = (await self.controller.engine.stats()).extra.get("adapters")
            return result
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
        self.signalled = sig
        if self._loop_over:
            log.warning("%s: the run has stopped; finishing its checkpoint and report (%s again exits at once)",
                        name, name)
            return
        log.warning("%s: stopping at the next step boundary with a checkpoint (%s again exits at once)", name, name)
        self.controller.request_stop()

    def _trained_already(self) -> RunResult | None:
        """The result of a run whose restored checkpoint is its final one (killed after that save):
        the totals saved with it; nothing is left to train."""
        meta = self.parts.meta
        if meta is None or not finished(meta, self.setup.run.steps):
            return None
        log.warning("resume: the run trained all %d steps before it stopped; writing its export and summary",
                    self.setup.run.steps)
        stats = self.controller.stats
        return RunResult(self.controller.step, True, stats, stats.elapsed_s, stats.trainer_busy_s,
                         stats.generator_busy_s)

    def _lead(self) -> dict[str, Any]:
        parts, controller = self.parts, self.controller
        try:
            result = self._trained_already() or asyncio.run(self._run())
        finally:
            controller.ledger.close()
            controller.trace.close()
            for sink in controller.sinks:
                sink.close()
            if parts.recorder is not None:
                parts.recorder.dump(self.run_dir / "policy_events.jsonl")
            parts.checkpointer.close()  # the last save is on disk (or its disk error raises here)
            host_memory.trim()  # what the save freed, before the export copies the weights
        extra: dict[str, Any] = {"placement": placement_summary(self.setup, parts.placement)}
        if controller.last_eval is not None:
            extra["eval"] = controller.last_eval
        if self.setup.trainer.lora.enabled:
            extra["lora"] = lora_summary(self.setup, parts.loaded, parts.trainer)
        if self._adapter_versions is not None:
            extra["adapter_versions"] = self._adapter_versions
        if result.completed and self.setup.run.export_hf:
            extra["hf_dir"] = str(export_hf(parts.loaded, parts.trainer, self.run_dir, self.setup))
        return write_summary(self.setup, result, bound=controller.policy.staleness_bound(), run_dir=self.run_dir,
                             extra=extra)
