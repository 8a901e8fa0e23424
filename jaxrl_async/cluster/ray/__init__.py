"""`cluster=ray`: generation engines (JAX or vLLM) as Ray actors behind one `GenerationEngine`.

One module per job: config.py (`RayClusterConfig`, the keys; imports nothing heavy), connect.py
(joining the cluster), actor.py (the worker side: `EngineSpec`, `build_engine`, `EngineActor`),
proxy.py (`RayEngineProxy`, the driver side). This file imports none of them, so that typing the
config never imports ray.

    runtime ──GenerationEngine──► RayEngineProxy ──► EngineActor × num_workers (one per bundle)
                                                     └─ JaxEngine | VllmEngine, own process/GPUs

- `connect(cfg)` joins the cluster (one-line error when the address is unreachable) and checks
  that it has the GPUs asked for; `RayEngineProxy` reserves one placement-group bundle per worker
  (`gpus_per_worker` GPUs + `cpus_per_worker` CPUs, PACK or SPREAD), so workers never share GPUs.
- Each actor builds its engine from an `EngineSpec` (engine name, its config, model source) and
  runs it on the actor's own event loop. The proxy routes a request to the live worker with the
  fewest live requests, merges the workers' output streams (long polls), and broadcasts weight
  updates: the params are `ray.put` once, every worker fetches them.
- **Faults**: when a worker dies (its process killed, its node lost), every request it held is
  handed to `on_lost(request_ids)` — the runtime calls the planner's fault path
  (`policy.on_group_lost(uid, prefix_kept=False)`) and resubmits, so nothing is lost and the
  re-admission keeps the staleness bound (docs/design.md §2). With `restart_lost` a replacement worker is
  started (and given the newest weights) in the freed bundle. Without `on_lost` the loss is a
  one-line error on the output stream: silently dropping groups would break no-drop.
- **Liveness, per worker**: every call to a worker (`poll`, `submit`, `abort`, `update_weights`,
  `stop`) has its own deadline (cluster/deadlines.py: clamp(20 x p99 of that kind's observed
  answer times, `rpc_timeout_floor_s`, `rpc_timeout_ceiling_s`), or the fixed `rpc_timeout_s`;
  a poll: its own wait plus that), and no call waits on all workers together, so one stopped
  worker never holds up the others: `stats()` reads what each worker's latest poll brought,
  `submit` / `abort` return once sent (a task awaits the answer), and `update_weights` waits for
  a worker that does not answer only 3x the first answer time (at least 1 s); a worker still
  behind gets no new request until it holds the new weights (the start barrier). A worker that
  misses its deadline — a hung or SIGSTOPped process, which Ray still reports alive — is treated
  as dead: it is `ray.kill`ed, its requests go to `on_lost` and a replacement takes its bundle,
  as above, with one warning line. The poll, every `poll_s`, is the heartbeat: a stopped worker
  is found within `poll_s` plus its poll deadline (~10 s) even when the runtime sends it nothing.
- `connect` runs `ray.init` under a deadline (`init_timeout_s`): Ray's own retries have none.
- `mark_critical` (`engine.speculation.when=critical`) goes to the worker that holds the request.

Left out: autoscaling, and moving in-flight prefixes between workers: lost requests restart, and
`policy.migrate=true` is refused at start-up under `cluster=ray` (proxy.py).
"""
