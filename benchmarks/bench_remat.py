"""Rematerialisation policies (`trainer.remat`) side by side: the train step's memory and speed.

Per policy, one compile of the jitted `train_step` (params and optimizer state donated, as
`Trainer` jits it), then:
- from XLA's memory analysis of the compiled step: temporary bytes (total and per token),
  argument bytes, and the peak = arguments + outputs - aliased (donated) + temporaries;
- unless `--analysis-only`: the step time (median of `--steps` rounds that run every policy
  once, after one warm-up call each, so that a change of machine load hits all alike; batch
  already on the device) and MFU, the model FLOPs of `bench_train_step.step_flops` (6 x matmul
  params x tokens + attention; the recompute is *not* counted, so remat lowers MFU by what it
  recomputes) over the matmul peak measured as `bench_train_step.matmul_flops` does.
A policy whose peak exceeds the memory the device lets JAX allocate (`memory_stats()`
bytes_limit: by default 75% of a GPU's; raise it with XLA_PYTHON_CLIENT_MEM_FRACTION=.95), or
whose compile or run runs out of it, is reported as "does not fit: <bytes>" and the others
still run. All policies compile before any weights are allocated.

Weight decay uses the optimizer's default mask (every leaf with ndim >= 2), not the Trainer's
matrices-only mask: the same memory and FLOPs up to the norms' few elementwise ops.

Needs only jax, flax, optax and numpy (PYTHONPATH=<repo root> where jaxrl_async is not
installed). Not a test:
  python benchmarks/bench_remat.py                       # the small shape of train_shape.py
  XLA_PYTHON_CLIENT_MEM_FRACTION=.95 python benchmarks/bench_remat.py --shape 4.7b --rows 8 --seq 2048 \
      --policies none full save_attn --steps 3
  python benchmarks/bench_remat.py --shape 4.7b --rows 16 --seq 2048 --analysis-only   # size only
The memory analysis of XLA:CPU is larger than XLA:GPU's for bfloat16 (none at 4.7b, 8 x 2048:
153 GiB of temporaries on CPU, 92.6 GiB on an H200): size for a GPU on the GPU.
Prints a table and one JSON line (also written to `--out`).
"""

from __future__ import annotations

import argparse
import json
import time

import jax
import numpy as np
from flax import nnx

from bench_train_step import matmul_flops, step_flops  # benchmarks/, beside this script
from train_shape import add_train_shape_args
from jaxrl_async.models.config import ModelConfig
from jaxrl_async.models.transformer import REMAT_CHOICES, Transformer
from jaxrl_async.trainer.batch import TrainBatch, pad_batch
from jaxrl_async.trainer.config import TrainerConfig
from jaxrl_async.trainer.optim import OptimConfig, make_optimizer
from jaxrl_async.trainer.step import train_step

# Flag defaults of a named shape (explicit flags still override them). "4.7b": the Llama-3.2-3B
# layout with an untied head (~3.6 B parameters as built here), bfloat16 compute.
PRESETS = {
    "4.7b": dict(layers=28, hidden=3072, heads=24, kv_heads=8, head_dim=128, intermediate=8192,
                 vocab=128256, dtype="bfloat16"),
}
GIB = 2 ** 30


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", choices=["small", *PRESETS], default="small",
                    help="small: the train_shape.py flags as given; a preset sets their defaults")
    add_train_shape_args(ap)
    ap.add_argument("--head-dim", type=int, default=None, help="default: hidden / heads")
    ap.add_argument("--intermediate", type=int, default=None, help="default: 4 x hidden")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"], help="compute dtype")
    ap.add_argument("--microbatches", type=int, default=1)
    ap.add_argument("--policies", nargs="+", default=list(REMAT_CHOICES), choices=REMAT_CHOICES)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--matmul-n", type=int, default=None, help="default: 8192 on GPU/TPU, 2048 on CPU")
    ap.add_argument("--analysis-only", action="store_true", help="compile and analyse; run no step")
    ap.add_argument("--limit-gib", type=float, default=None,
                    help="the memory a policy must fit in (default: the device's bytes_limit; none on CPU)")
    ap.add_argument("--out", default=None, help="also write the JSON here")
    shape = ap.parse_known_args()[0].shape
    ap.set_defaults(**PRESETS.get(shape, {}))
    return ap.parse_args()


def model_config(args: argparse.Namespace) -> ModelConfig:
    return ModelConfig.tiny(
        vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=args.intermediate or 4 * args.hidden,
        num_layers=args.layers, num_heads=args.heads, num_kv_heads=args.kv_heads,
        head_dim=args.head_dim or args.hidden // args.heads, max_position_embeddings=max(args.seq, 2048),
        bos_token_id=None, eos_token_ids=())


def make_batch(args: argparse.Namespace) -> TrainBatch:
    """Random rows as bench_train_step.py builds them: a quarter prompt, the rest completion."""
    rng = np.random.default_rng(0)
    prompt = args.seq // 4
    samples = [(list(rng.integers(0, args.vocab, prompt)), list(rng.integers(0, args.vocab, args.seq - prompt)),
                list(-rng.uniform(5, 9, args.seq - prompt)), float(rng.random()), i // 4)
               for i in range(args.rows)]
    return pad_batch(samples, buckets=[args.seq])


def shapes(tree):
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), tree)


def device_memory() -> int | None:
    """Bytes the first device may allocate, where the backend says (not on CPU)."""
    stats = jax.devices()[0].memory_stats() or {}
    return stats.get("bytes_limit")


def analyse(compiled) -> dict:
    m = compiled.memory_analysis()
    peak = m.argument_size_in_bytes + m.output_size_in_bytes - m.alias_size_in_bytes + m.temp_size_in_bytes
    return {"temp_bytes": int(m.temp_size_in_bytes), "arg_bytes": int(m.argument_size_in_bytes),
            "out_bytes": int(m.output_size_in_bytes), "alias_bytes": int(m.alias_size_in_bytes),
            "peak_bytes": int(peak)}


def run_step(compiled, state: dict, batch: TrainBatch) -> float:
    """Seconds of one step; the donated params and optimizer state are replaced by the step's
    outputs (`state` is updated in place)."""
    t = time.perf_counter()
    state["params"], state["opt"], metrics = compiled(state["params"], state["opt"], batch)
    jax.block_until_ready(metrics)
    return time.perf_counter() - t


def make_state(cfg: ModelConfig, optim: OptimConfig) -> dict:
    """Random float32 params and their AdamW state, on the first device."""
    device = jax.devices()[0]
    model = Transformer(cfg, rngs=nnx.Rngs(0))
    params = jax.device_put(nnx.state(model, nnx.Param).to_pure_dict(), device)
    return {"params": params, "opt": jax.device_put(jax.jit(make_optimizer(optim).init)(params), device)}


def time_policies(compiled: dict, peaks: dict, new_state, batch: TrainBatch, steps: int) -> dict[str, float]:
    """Median step seconds per policy: one warm-up call each, then `steps` rounds that call
    every policy once, so that a change of machine load hits all policies alike. A policy that
    runs out of device memory is dropped with "does not fit" (the others go on, on fresh
    weights if the failed call had consumed the donated ones)."""
    times, state = {}, new_state()
    for policy, fn in compiled.items():
        try:
            run_step(fn, state, batch)
            times[policy] = []
        except jax.errors.JaxRuntimeError as err:
            if not is_out_of_memory(err):
                raise
            print(f"{policy}: does not fit: {peaks[policy]} bytes ({str(err).splitlines()[0][:160]})", flush=True)
            if any(x.is_deleted() for x in jax.tree.leaves(state)):
                state = new_state()
    for _ in range(steps):
        for policy in times:
            times[policy].append(run_step(compiled[policy], state, batch))
    return {policy: float(np.median(t)) for policy, t in times.items()}


def is_out_of_memory(err: Exception) -> bool:
    return "RESOURCE_EXHAUSTED" in str(err) or "Out of memory" in str(err)


def main() -> None:
    args = parse_args()
    cfg = model_config(args)
    base = TrainerConfig(optim=OptimConfig(lr=1e-5), num_microbatches=args.microbatches, compute_dtype=args.dtype)
    graphdef, abstract = nnx.split(nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0))), nnx.Param)
    param_shapes = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, np.float32), abstract.to_pure_dict())
    opt_shapes = jax.eval_shape(make_optimizer(base.optim).init, param_shapes)
    host_batch = make_batch(args)
    tokens = args.rows * args.seq
    n_params = sum(x.size for x in jax.tree.leaves(param_shapes))
    flops = step_flops(cfg, param_shapes, args.rows, args.seq)
    limit = int(args.limit_gib * GIB) if args.limit_gib else device_memory()
    step = jax.jit(train_step, static_argnames=("graphdef", "cfg", "decay_paths"),
                   donate_argnames=("params", "opt_state"))

    rows, compiled, failed = [], {}, []
    for policy in args.policies:  # compile first, so that XLA's autotuning has the whole device
        tcfg = TrainerConfig(optim=base.optim, num_microbatches=args.microbatches, compute_dtype=args.dtype,
                             remat=policy)
        t = time.perf_counter()
        try:
            fn = step.lower(graphdef, param_shapes, opt_shapes, shapes(host_batch), cfg=tcfg,
                            decay_paths=None).compile()
        except jax.errors.JaxRuntimeError as err:
            if not is_out_of_memory(err):
                raise
            print(f"{policy}: does not fit: compiling ran out of memory ({str(err).splitlines()[0][:160]})")
            failed.append({"policy": policy, "fits": False, "error": str(err).splitlines()[0]})
            continue
        row = {"policy": policy, "compile_s": time.perf_counter() - t, **analyse(fn)}
        row["temp_bytes_per_token"] = row["temp_bytes"] / tokens
        row["fits"] = limit is None or row["peak_bytes"] <= limit
        print(f"{policy}: compiled in {row['compile_s']:.1f} s, temp {row['temp_bytes'] / GIB:.2f} GiB, "
              f"peak {row['peak_bytes'] / GIB:.2f} GiB", flush=True)
        if not row["fits"]:
            print(f"{policy}: does not fit: {row['peak_bytes']} bytes (device limit {limit})", flush=True)
        elif not args.analysis_only:
            compiled[policy] = fn
        rows.append(row)

    peak_flops = None
    if compiled:
        default_n = 2048 if jax.default_backend() == "cpu" else 8192
        peak_flops = matmul_flops(args.matmul_n or default_n, args.dtype, repeats=5)
        batch = jax.device_put(host_batch, jax.devices()[0])
        peaks = {r["policy"]: r["peak_bytes"] for r in rows}
        step_s = time_policies(compiled, peaks, lambda: make_state(cfg, base.optim), batch, args.steps)
        for row in rows:
            if row["policy"] in step_s:
                row["step_s"] = step_s[row["policy"]]
                row["mfu"] = flops / row["step_s"] / peak_flops
            elif row["policy"] in compiled:
                row["fits"] = False

    if not rows:
        raise SystemExit("no policy compiled")
    # Ratios against "none" where it was measured, else against the first policy that was.
    ref = next((r for r in rows if r["policy"] == "none"), rows[0])
    ran = [r for r in rows if "step_s" in r]
    time_ref = ref if "step_s" in ref else (ran or [ref])[0]
    for r in rows:
        r["temp_vs_ref"] = r["temp_bytes"] / max(ref["temp_bytes"], 1)
        if "step_s" in r:
            r["time_vs_ref"] = r["step_s"] / time_ref["step_s"]
    print_table(rows, ref["policy"], time_ref["policy"])
    result = {
        "device": str(jax.devices()[0].device_kind), "shape": args.shape, "params": int(n_params),
        "layers": cfg.num_layers, "hidden": cfg.hidden_size, "vocab": cfg.vocab_size, "dtype": args.dtype,
        "rows": args.rows, "seq": args.seq, "microbatches": args.microbatches, "tokens": tokens,
        "model_flops": flops, "matmul_tflops": peak_flops and peak_flops / 1e12,
        "device_limit_bytes": limit, "temp_ref": ref["policy"], "time_ref": time_ref["policy"],
        "policies": rows + failed,
    }
    print(json.dumps(result))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)


def print_table(rows: list[dict], ref: str, time_ref: str) -> None:
    head = (f"{'policy':>14} {'temp GiB':>9} {'KiB/tok':>8} {'args GiB':>9} {'peak GiB':>9} "
            f"{'temp/' + ref:>10} {'step s':>8} {'time/' + time_ref:>10} {'MFU':>6} {'compile s':>9}")
    print(head)
    for r in rows:
        run = (f"{r['step_s']:>8.3f} {r['time_vs_ref']:>10.2f} {r['mfu']:>6.1%}"
               if "step_s" in r else f"{'-' if r['fits'] else 'no fit':>8} {'-':>10} {'-':>6}")
        print(f"{r['policy']:>14} {r['temp_bytes'] / GIB:>9.3f} {r['temp_bytes_per_token'] / 1024:>8.1f} "
              f"{r['arg_bytes'] / GIB:>9.3f} {r['peak_bytes'] / GIB:>9.3f} {r['temp_vs_ref']:>10.2f} {run} "
              f"{r['compile_s']:>9.1f}")


if __name__ == "__main__":
    main()
