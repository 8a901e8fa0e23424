"""The async runtime: drives any staleness policy with a real engine, trainer and task.

- `controller`: the local-mode event loop (asyncio for control, threads for device work); it keeps
  the order of calls, its side jobs live in:
  - `outbox`: typed engine commands sent after a decision is applied, and the start barriers;
  - `tracing`: the timing trace (trace.jsonl) and the engine's timings;
  - `liveness`: stall detection and its watchdog task;
  - `evaluation`: held-out evaluation on the engine (when, the requests, the figures);
  - `supervisor`: the run's asyncio tasks, whose first failure ends the run.
- `rollouts`: streamed engine pieces -> groups (start version, tokens by version, done).
- `scoring`: a done group's rewards through the task's never-raising reward runner.
- `batching`: scored groups -> the trainer's padded `TrainBatch`; staleness of a batch.
- `metrics`: run totals, the per-step record and its sinks (metrics.jsonl, TensorBoard), summary.json.
- `progress`: the live display (rich on a terminal, plain lines otherwise) and the ETA.
- `state`: `ControllerSnapshot` (what `Controller.snapshot` / `restore` exchange) and its JSON in a
  checkpoint (the arrays are `jaxrl_async.checkpoint`'s).
- `config`: `RunConfig`, the typed top level of conf/train.yaml.

The entry point is `python -m jaxrl_async.train` (jaxrl_async/cli/train.py, the run in jaxrl_async/job/). Another orchestration
mode (ray) would reuse all of these and replace only how the engine is reached.
"""
