"""The async runtime: drives any staleness policy with a real engine, trainer and task.

- `controller`: the local-mode event loop (asyncio for control, threads for device work); it keeps
  the order of calls, its side jobs live in:
  - `outbox`: typed engine commands sent after a decision is applied, and the start barriers (a
    group never starts on weights older than its `Admission.version`);
  - `tracing`: the timing trace (trace.jsonl) and the engine's timings;
  - `liveness`: stall detection (`rollout.stall_timeout_s`) and its watchdog task, which sends
    stalled groups through the fault path and ends a hung engine's run;
  - `evaluation`: held-out evaluation on the engine (when, the requests, the figures);
  - `supervisor`: the run's asyncio tasks, whose first failure ends the run;
  - `groups`: the candidate window and the live groups, in the planner's `GroupState` (being scored
    is RUNNING's last part), and their part of a checkpoint;
  - `clock`: run seconds and the trainer's and engine's busy seconds, across resumed segments.
  - `recording`: the run's record — ledger and trace lines of each event, the run's totals
    (the tail's counts included), one metrics record per step;
  - `training`: a step's trainer side — the optimizer step in its own thread, timed, and the
    publication of its weights;
  - `requests`: an admitted group's engine request (sampling limits, seed, priority);
  - `tail`: the planner's critical marks and migrations as engine calls.
- `rollouts`: streamed engine pieces -> groups (start version, tokens by version, done).
- `scoring`: a done group's rewards through the task's never-raising reward runner, and the run's
  reward book (counts, failures, the stop when too many fail).
- `batching`: scored groups -> the trainer's padded `TrainBatch`; staleness of a batch.
- `metrics`: run totals, the per-step record and its sinks (metrics.jsonl, TensorBoard), summary.json.
- `progress`: the live display (rich on a terminal, plain lines otherwise) and the ETA (which
  leaves the first step's compile out).
- `state`: `ControllerSnapshot` (what `Controller.snapshot` / `restore` exchange) and its JSON in a
  checkpoint (the arrays are `jaxrl_async.checkpoint`'s).
- `config`: `RunConfig`, the typed top level of conf/train.yaml.

The entry point is `python -m jaxrl_async.train` (jaxrl_async/cli/train.py, the run in jaxrl_async/job/). Another orchestration
mode (ray) would reuse all of these and replace only how the engine is reached.
"""
