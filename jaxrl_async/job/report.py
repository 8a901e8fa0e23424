"""What a run says about itself: summary.json (with the audit's verdict and the placement), the
timing trace's `run` line, the HF export of the final policy (with LoRA: the base and its PEFT
adapter), and the report printed at the end.

Every fact about the engine comes from its registry entry (`TrainSetup.engine_facts`) and every
fact about where it runs from the cluster config (`engine_workers`), so a new backend or cluster
mode reports itself without a change here.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from jaxrl_async.cluster.placement import Placement
from jaxrl_async.job.setup import TrainSetup
from jaxrl_async.job.tail_keys import policy_params, tail_keys
from jaxrl_async.models.hf_weights import save_hf
from jaxrl_async.models.loading import LoadedModel
from jaxrl_async.models.lora import merged_params
from jaxrl_async.models.peft_adapter import save_peft
from jaxrl_async.runtime.metrics import METRICS_FILE, SUMMARY_FILE, record_times, summary, write_json
from jaxrl_async.runtime.progress import tail_text
from jaxrl_async.trainer.trainer import Trainer
from planner.ledger_audit import audit, audited_bound
from planner.run_trace import TRACE_FILE
from planner.tail_analysis import from_run_dir as tail_of_run


def trace_meta(setup: TrainSetup, placement: Placement | None = None) -> dict[str, Any]:
    """The timing trace's `run` line (planner/run_trace.py): the planner's context and what the
    simulator needs of the engine — workers, slots per worker, KV tokens per worker, sync mode,
    whether it shares the trainer's devices (`colocated`: an engine the trainer's process places
    with `engine.colocate=true`; other engines place themselves and time no iterations) and, for an
    engine that speculates, its `engine.speculation.*` (what calibration needs to fit the
    acceptance rate from the drafted and accepted tokens)."""
    run, facts = setup.run, setup.engine_facts
    colocated = (placement is not None and placement.colocate and facts.colocate and not facts.places_itself
                 and setup.engine_in_process)
    speculation = facts.speculation
    return {"policy": setup.policy_name, "max_staleness": run.max_staleness, "batch_groups": run.batch_groups,
            "group_size": run.group_size, "admission_window": run.window, "max_new_tokens": run.max_new_tokens,
            "engine": setup.engine_name,
            "workers": setup.engine_workers, "slots": facts.slots, "kv_tokens": facts.kv_tokens,
            "sync_mode": facts.sync_mode, "colocated": bool(colocated),
            # pinned: the versions a worker holds at once (the simulator's resident_versions)
            **({"adapter_versions": facts.adapter_versions} if facts.sync_mode == "pinned" else {}),
            **({"speculation": dataclasses.asdict(speculation)} if speculation is not None and speculation.enabled
               else {})}


def placement_summary(setup: TrainSetup, placement: Placement) -> dict[str, Any]:
    """summary.json's `placement`: counted from the meshes the run built; an engine in a cluster's
    workers or one that places itself has its entry name the backend and its replicas."""
    out = placement.summary()
    facts = setup.engine_facts
    if not setup.engine_in_process:
        out["engine"] = {"backend": f"{setup.cluster.name}/{setup.engine_name}", "replicas": setup.engine_workers}
    elif facts.places_itself:
        out["engine"] = {"backend": setup.engine_name, "replicas": facts.replicas,
                         "tensor_parallel": facts.tensor_parallel}
    else:
        out["engine"]["backend"] = setup.engine_name
    return out


def export_hf(loaded: LoadedModel, trainer: Trainer, run_dir: Path, setup: TrainSetup) -> Path:
    """The trainer's final policy as HF safetensors in `run_dir/hf/`, in the model's dtype.

    With LoRA, hf/ holds the base model (the frozen weights the adapter trained on) and the
    adapter in PEFT's format beside it (models/peft_adapter.py): transformers loads hf/ as base +
    adapter, `model.source=hf model.adapter=hf` loads it here; `trainer.lora.export_merged` also
    writes the merged weights as a plain HF model into hf/merged/."""
    if not trainer.lora:
        # The trainer's own arrays in the model's dtype (no copy on one process in float32; host
        # arrays gathered from every process when the mesh spans them): a copy here would be
        # 0.5-1 GiB more at the run's end for SmolLM2-135M (docs/memory.md).
        params = jax.tree.map(jnp.asarray, trainer.engine_params(loaded.cfg.dtype))
        return save_hf(nnx.merge(trainer.graphdef, params), loaded.cfg, run_dir / "hf", loaded.tokenizer)
    trained = trainer.host_params()
    out = save_hf(loaded.model, loaded.cfg, run_dir / "hf", loaded.tokenizer)  # the base: never trained
    lora = setup.trainer.lora
    save_peft(trained, loaded.cfg, out, alpha=lora.alpha, base_model=setup.model.source)
    if lora.export_merged:
        base = nnx.to_pure_dict(nnx.state(loaded.model, nnx.Param))
        merged = nnx.merge(trainer.graphdef, merged_params(base, trained))
        save_hf(merged, loaded.cfg, out / "merged", loaded.tokenizer)
    return out


def lora_summary(setup: TrainSetup, loaded: LoadedModel, trainer: Trainer) -> dict[str, Any]:
    """summary.json's `lora`: the adapter's size, what one weight push moves, adapter against the
    full weights (both in the engine's dtype, the model's), and the engine's sync mode with
    adapters (engine=vllm: pinned, each request keeps the adapter it started with)."""
    itemsize = jnp.dtype(loaded.cfg.dtype).itemsize
    adapter = sum(x.size for x in jax.tree.leaves(trainer.params(copy=False)))
    full = sum(x.size for x in jax.tree.leaves(nnx.state(loaded.model, nnx.Param)))
    lora = setup.trainer.lora
    return {"rank": lora.rank, "alpha": lora.alpha, "targets": list(lora.targets), "adapter_params": adapter,
            "push_bytes": adapter * itemsize, "full_push_bytes": full * itemsize,
            "push_fraction": adapter / full, "sync_mode": setup.engine_facts.sync_mode}


def write_summary(setup: TrainSetup, result: Any, *, bound: int | None, run_dir: Path,
                  extra: dict[str, Any]) -> dict[str, Any]:
    """summary.json for the controller's `result` (its `RunResult`): docs/design.md §8.1's keys,
    `extra`, the policy's parameters and the engine's speculation keys when it speculates (so
    that the report can say what the tail's features did), and — when the run finished — the
    audit's verdict over the run's files and, with a timing trace, `tail` (planner/tail_analysis.py:
    where the tail's time went)."""
    run = setup.run
    params = policy_params(setup)
    extra = {"completed": result.completed, "run_dir": str(run_dir), **extra,
             "policy_params": dataclasses.asdict(params) if dataclasses.is_dataclass(params) else {}}
    spec = tail_keys(setup).speculation
    if spec is not None:
        extra["speculation"] = dataclasses.asdict(spec)
    if result.completed:
        report = audit(run_dir, audited_bound(run.max_staleness, bound))
        extra.update(audit_ok=report.ok, audit_verdict=report.verdict(), groups_lost=len(report.lost),
                     groups_trained_twice=len(report.trained_twice), length_bias=report.length_bias)
        if (run_dir / TRACE_FILE).is_file():  # where the tail's time went (planner/tail_analysis.py)
            extra["tail"] = tail_of_run(run_dir)
    out = summary(result.stats, policy=setup.policy_name, max_staleness=run.max_staleness, staleness_bound=bound,
                  elapsed_s=result.elapsed_s, trainer_busy_s=result.trainer_busy_s,
                  generator_busy_s=result.generator_busy_s, record_s=record_times(run_dir / METRICS_FILE),
                  extra=extra)
    write_json(run_dir / SUMMARY_FILE, out)
    return out


def _by_kind(out: Mapping[str, Any]) -> str:
    """" (timeout 3, ValueError 1)": the final report's reward errors by kind (none: nothing)."""
    kinds = out.get("reward_errors_by_type") or {}
    return f" ({', '.join(f'{k} {n}' for k, n in sorted(kinds.items()))})" if kinds else ""


def _steady(out: Mapping[str, Any]) -> str:
    """The steady-state rate beside the whole-run one: the whole run includes the compile."""
    steady = out.get("steps_per_hour_steady")
    return f"; steady state {steady:.0f}, without the compile" if steady else ""


def final_report(out: Mapping[str, Any], metrics_path: Path) -> str:
    """The short report printed at the end of a run."""
    records = [json.loads(line) for line in metrics_path.read_text().splitlines() if line.strip()]
    rewards = [r["reward_mean"] for r in records]
    head, tail = rewards[:3], rewards[-3:]
    lines = [
        f"run dir: {out['run_dir']}",
        f"policy {out['policy']}, η={out['max_staleness']}: {out['steps']} steps in {out['elapsed_s']:.0f}s "
        f"({out['steps_per_hour']:.0f} steps/h{_steady(out)}), {out['steps_skipped']} skipped",
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
    tail = tail_text(out, speculation=bool(out.get("speculation")),
                     migration=bool((out.get("policy_params") or {}).get("migrate")) or bool(out.get("groups_migrated")))
    if tail:  # the tail's features that were on, and what they did
        lines.append(f"tail: {tail}")
    if out.get("completed"):
        lines.append(out["audit_verdict"])
    else:
        lines.append(f"stopped at step {out['steps']}: resume with resume={out['run_dir']}")
    return "\n".join(lines)
