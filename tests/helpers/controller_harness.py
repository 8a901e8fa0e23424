"""A fast, deterministic local-mode harness for the controller's fault and resume paths.

The real `Controller`, policy (`planner.registry`), ledger, task, prompt stream, tokenizer and
rollout collector; in place of the device work, two test doubles whose timing the test owns:

- `ScriptedEngine`: a `GenerationEngine` that finishes a request the moment it is submitted,
  unless the test holds it (`hold`), in which case it waits until `release` (or `abort`). Every
  token carries the weight version the engine holds, as the contract asks. It records what was
  submitted, aborted and pushed, so a test can see a start barrier or an abort.
- `InstantTrainer`: `Trainer.step`'s contract without JAX — it records each batch and returns
  the metrics the controller reads.
- `MemoryCheckpointer`: `Checkpointer`'s contract (save / due / latest) keeping the JSON meta of
  each save (JSON round-tripped, as orbax writes it) in memory.

A whole run (tens of steps) takes well under a second, so the mutation run of the controller's
fault path (benchmarks/mutation.sh) can afford it for every mutant.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from jaxrl_async.engines.base import (END_OF_OUTPUTS, EngineStats, GenerationEngine, GenerationRequest,
                                      SampleOutput, read_outputs)
from jaxrl_async.runtime.config import RunConfig
from jaxrl_async.runtime.controller import Controller
from jaxrl_async.runtime.metrics import METRICS_FILE, JsonlSink
from jaxrl_async.tasks import build_task
from jaxrl_async.tokenizer import tiny_tokenizer
from planner.ledger import LEDGER_FILE, LedgerWriter
from planner.registry import make_policy
from planner.types import PlanContext

TOKEN = 97  # "a": every sample of the scripted engine is TOKEN * tokens


class ScriptedEngine(GenerationEngine):
    """Finishes each request at submit time, except the ones `hold(request_id) -> True` names."""

    def __init__(self, *, tokens: int = 2, hold: Callable[[GenerationRequest], bool] | None = None,
                 version: int = 0) -> None:
        self.tokens = tokens
        self.hold = hold or (lambda request: False)
        self.version = version
        self.live: dict[str, GenerationRequest] = {}  # held requests
        self.submitted: list[str] = []
        self.aborted: list[str] = []
        self.pushes: list[int] = []
        self._out: asyncio.Queue = asyncio.Queue()

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        self._out.put_nowait(END_OF_OUTPUTS)

    async def submit(self, request: GenerationRequest) -> None:
        if request.request_id in self.live or request.request_id in self.submitted:
            raise ValueError(f"request {request.request_id!r}: request_id was already submitted")
        self.submitted.append(request.request_id)
        if self.hold(request):
            self.live[request.request_id] = request
        else:
            self._finish(request, "length")

    def release(self, request_id: str) -> None:
        """Finish a held request now, on the engine's current weights."""
        self._finish(self.live.pop(request_id), "length")

    def _finish(self, request: GenerationRequest, reason: str, tokens: int | None = None) -> None:
        count = self.tokens if tokens is None else tokens
        for i in range(request.sampling.n):
            self._out.put_nowait(SampleOutput(request.request_id, i, [TOKEN] * count, [-1.0] * count,
                                              [[self.version, count]] if count else [], reason, True))

    async def abort(self, request_id: str) -> None:
        self.aborted.append(request_id)
        request = self.live.pop(request_id, None)
        if request is not None:
            self._finish(request, "abort", tokens=0)

    async def update_weights(self, params: Any, version: int) -> None:
        if version < self.version:
            raise ValueError(f"update_weights: version={version} goes backwards (engine holds {self.version})")
        self.version = version
        self.pushes.append(version)

    def outputs(self) -> AsyncIterator[SampleOutput]:
        return read_outputs(self._out)

    async def stats(self) -> EngineStats:
        return EngineStats(active_slots=len(self.live), total_slots=64, queued=0, busy_fraction=0.5,
                           version=self.version)


class InstantTrainer:
    """What the controller asks of `jaxrl_async.trainer.Trainer`, with no model behind it."""

    rows_multiple = 1

    def __init__(self, version: int = 0) -> None:
        self.version = version
        self.batches: list[Any] = []

    def step(self, batch: Any) -> dict[str, float]:
        self.batches.append(batch)
        self.version += 1
        return {"loss": 0.0, "reward_mean": 0.0, "skipped": 0.0}

    def engine_params(self, dtype: str) -> dict[str, int]:
        return {"version": self.version}

    def state_dict(self) -> dict[str, int]:
        return {"version": self.version}

    def lend(self, release: Any) -> None:  # nothing to donate: the arrays are never read in place
        pass


class MemoryCheckpointer:
    """`jaxrl_async.checkpoint.Checkpointer`'s save/due/latest, the meta kept as written JSON."""

    def __init__(self, every: int = 0) -> None:
        self.every = every
        self.saves: list[tuple[int, dict[str, Any], dict[str, Any]]] = []

    def due(self, steps_done: int) -> bool:
        return self.every > 0 and steps_done % self.every == 0

    def save(self, steps_done: int, trainer_state: dict[str, Any], meta: dict[str, Any]) -> None:
        self.saves.append((steps_done, dict(trainer_state), json.loads(json.dumps(meta))))

    def wait_written(self) -> None:  # saves are synchronous
        pass

    @property
    def latest_meta(self) -> dict[str, Any]:
        return self.saves[-1][2]


def make_controller(run_dir: Path, *, steps: int = 6, batch_groups: int = 2, group_size: int = 2,
                    max_staleness: int | None = 1, policy: str = "lookahead", engine: ScriptedEngine | None = None,
                    checkpointer: MemoryCheckpointer | None = None, resuming: bool = False) -> Controller:
    """A controller over `run_dir` (ledger.jsonl and metrics.jsonl there) with the doubles above."""
    cfg = RunConfig(max_staleness=max_staleness, batch_groups=batch_groups, group_size=group_size, steps=steps,
                    max_new_tokens=4, seed=0, temperature=0.9, top_p=0.95, export_hf=False, progress="off",
                    tensorboard=False)
    tokenizer = tiny_tokenizer()
    task = build_task({"name": "repeat_letter", "num_prompts": 16})
    run_dir.mkdir(parents=True, exist_ok=True)
    return Controller(
        cfg, policy=make_policy(policy, PlanContext(batch_groups, group_size, max_staleness, steps)),
        engine=engine or ScriptedEngine(), trainer=InstantTrainer(), task=task, tokenizer=tokenizer,
        stream=task.make_stream(tokenizer, None, seed=0), run_dir=run_dir,
        ledger=LedgerWriter(run_dir / LEDGER_FILE, append=resuming, buffer_lines=256),
        sinks=[JsonlSink(run_dir / METRICS_FILE, append=resuming)], checkpointer=checkpointer, stop_token_ids=(0,),
        run_config_meta={"policy": policy, "batch_groups": batch_groups})


def run(controller: Controller, timeout_s: float = 30.0):
    """`controller.run()` to its end (or stop) on a fresh event loop; a hang fails the test."""
    async def main():
        return await asyncio.wait_for(controller.run(), timeout_s)

    try:
        return asyncio.run(main())
    finally:
        for sink in controller.sinks:
            sink.close()
        controller.ledger.close()
