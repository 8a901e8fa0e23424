"""A small training run's files written by hand, as `python -m jaxrl_async.train` writes them
(`trace.jsonl`, `metrics.jsonl`, `summary.json`, `.hydra/config.yaml`), whose every time follows
the simulator's cost model, so a calibrated replay of it must reproduce it.

The run is trainer-bound: each step's groups are generated in milliseconds during the previous
step; the trainer hands a batch over once every worker holds the last version (`wait_sync`). The
engine compiles `DECODE_COMPILE` s before its first token and the trainer's first step compiles
`TRAIN_COMPILE` s: the warm-up the whole-run steps/h includes and the steady state does not. As in
a real run, the metrics' `gen_active` is sampled at step ends, when the engine is idle (all 0):
the active sequences are in the trace only.
"""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from planner import run_files
from planner.run_trace import TraceWriter

B, N, STEPS, ETA, SLOTS = 2, 2, 12, 1, 16
LENGTHS, PROMPT = (6, 10), 20  # every group alike: every batch costs the same
ALPHA, BETA, PREFILL = 1e-3, 1e-4, 1e-5
C0, C1, LAG, T_SYNC = 0.3, 1e-3, 0.01, 0.02
DECODE_COMPILE, TRAIN_COMPILE = 2.0, 3.0
POLICY_PARAMS = {"max_untrained_groups": 4}  # set in the run's config: the replay must pass it on


def decode_s(steps: int, tokens: int, prefill: int) -> float:
    return ALPHA * steps + BETA * tokens + PREFILL * prefill


def write_training_run(run_dir: Path) -> Path:
    """The run's files in `run_dir` (created); returns it."""
    run_dir.mkdir(parents=True)
    (run_dir / ".hydra").mkdir()
    (run_dir / ".hydra" / "config.yaml").write_text(yaml.safe_dump({
        "max_staleness": ETA, "batch_groups": B, "group_size": N, "steps": STEPS,
        "policy": {"name": "lookahead", "predictor": "???", **POLICY_PARAMS}}))  # ???: not given
    trace = TraceWriter(run_dir / "trace.jsonl")
    trace.write("run", 0.0, step=0, policy="lookahead", max_staleness=ETA, batch_groups=B, group_size=N,
                admission_window=2 * B, max_new_tokens=max(LENGTHS), engine="jax", workers=1, slots=SLOTS,
                kv_tokens=SLOTS * 64, sync_mode="partial", colocated=False)
    response, prompt = B * sum(LENGTHS), B * N * PROMPT

    def generate(k: int, t: float, training: bool) -> list[tuple]:
        """Step k's groups, admitted at t, generated at once: the engine iterations it took."""
        for uid in range(k * B, (k + 1) * B):
            trace.write("admit", t, uid=uid, attempt=0, prompt_id=f"p{uid}", prompt_tokens=PROMPT, version=max(0, k - 1))
            trace.write("start", t + 0.004, uid=uid, attempt=0, version=max(0, k - 1), worker=0)
            trace.write("finish", t + 0.02, uid=uid, attempt=0, lengths=list(LENGTHS))
        prefill = 40 + 4 * k  # varies, so the decode coefficients are determined
        return [(0, decode_s(6, 24, prefill), 6, 24, prefill, False, training),
                (0, decode_s(4, 8, 0), 4, 8, 0, False, training)]

    calls = [(0, DECODE_COMPILE + decode_s(8, 16, 40), 8, 16, 40, True, False)]  # the engine compiles first
    calls += generate(0, 0.001, False)
    handed = DECODE_COMPILE + 0.05
    hist: dict[int, int] = {}
    records = []
    for k in range(STEPS):
        if k + 1 < STEPS:
            calls += generate(k + 1, handed, True)  # the next batch is generated during this step
        duration = C0 + C1 * (response + prompt) + (TRAIN_COMPILE if k == 0 else 0.0)
        end = handed + duration
        trace.write("train", handed, step=k, start=handed, end=end, groups=B, tokens=response, prompt_tokens=prompt)
        trace.decode(end, calls)
        calls = []
        staleness = min(k, 1)  # step 0 trains version-0 tokens; later steps the previous version's
        batch = {staleness: response}
        hist[staleness] = hist.get(staleness, 0) + response
        records.append(run_files.step_record(
            step=k, reward_mean=0.0, loss=0.0, batch=batch, cycle_s=end + 0.001 - (records[-1]["elapsed_s"] if records else 0.0),
            wait_s=0.0, start_s=handed, end_s=end, elapsed_s=end + 0.001, trainer_busy_s=0.0, generator_busy_s=0.0,
            gen_active=[0], kv_usage=0.0, staleness=dict(hist)))
        if k + 1 < STEPS:
            trace.write("publish", end, version=k + 1)
            trace.write("load", end + LAG, version=k + 1, worker=0, s=T_SYNC)
            trace.write("synced", end + LAG + T_SYNC, version=k + 1)
            handed = end + LAG + T_SYNC  # the runtime pushes the weights before it selects the next batch
    trace.close()
    with open(run_dir / "metrics.jsonl", "w", encoding="utf-8") as fh:
        for r in records:
            fh.write(json.dumps(r) + "\n")
    elapsed = records[-1]["elapsed_s"]
    summary = run_files.summary(
        policy="lookahead", max_staleness=ETA, staleness_bound=ETA, steps=STEPS, groups_admitted=B * STEPS,
        groups_trained=B * STEPS, groups_dropped=0, tokens_wasted=0, staleness=hist, elapsed_s=elapsed,
        trainer_busy_s=sum(r["end_s"] - r["start_s"] for r in records), generator_busy_s=0.1,
        record_s=[r["elapsed_s"] for r in records], extensions={"completed": True})
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    return run_dir
