"""Chunked logits (`trainer.logits_chunk`) beside remat (`trainer.remat`): the train step's
temporary memory and speed per setting.

Per (remat, logits_chunk) pair, one compile of the jitted `train_step` (params and optimizer
state donated, as `Trainer` jits it), then:
- from XLA's memory analysis of the compiled step: temporary bytes, total and per token, and
  their ratio to the whole-logits step of the same remat and to `none` / 0 (today's default);
- unless `--analysis-only`: the step time, the median of `--steps` rounds that run every setting
  once after one warm-up call each (so that a change of machine load hits all alike), and its
  ratio to `none` / 0: the cost of the extra head matmul that chunking recomputes.
The shape is benchmarks/train_shape.py's (what bench_remat.py and bench_train_step.py use) with
the vocabulary raised to 32768 and 8 rows by default: at train_shape's 4096 the logits are a
small part of the step, and a 128k vocabulary at a real hidden size is what the option is for
(8 x 2048 tokens of float32 logits are 8.4 GB an array). Flags override any of it.

Weight decay uses the optimizer's default mask, as in bench_remat.py, whose helpers this reuses.
Needs only jax, flax, optax and numpy (PYTHONPATH=<repo root> where jaxrl_async is not
installed). Not a test:
  python benchmarks/bench_logits_chunk.py                                   # 32k vocab, 8 x 256
  python benchmarks/bench_logits_chunk.py --vocab 4096 --rows 16 --analysis-only  # train_shape's own
Prints a table and one JSON line (also written to `--out`).
"""

from __future__ import annotations

import argparse
import json
import time

import jax
import numpy as np
from flax import nnx

from bench_remat import analyse, make_batch, make_state, run_step, shapes  # benchmarks/, beside this script
from train_shape import add_train_shape_args, train_shape_config
from jaxrl_async.models.transformer import REMAT_CHOICES, Transformer
from jaxrl_async.trainer.config import TrainerConfig
from jaxrl_async.trainer.optim import OptimConfig, make_optimizer
from jaxrl_async.trainer.step import train_step

MIB = 2 ** 20


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_train_shape_args(ap)
    ap.set_defaults(vocab=32768, rows=8)
    ap.add_argument("--chunks", type=int, nargs="+", default=[0, 256, 1024], help="logits_chunk values (0: whole)")
    ap.add_argument("--remat", nargs="+", default=["none", "full"], choices=REMAT_CHOICES)
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"], help="compute dtype")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--analysis-only", action="store_true", help="compile and analyse; run no step")
    ap.add_argument("--out", default=None, help="also write the JSON here")
    return ap.parse_args()


def time_settings(compiled: dict, new_state, batch, steps: int) -> dict[tuple, float]:
    """Median step seconds per setting: a warm-up call each, then `steps` rounds of one call each."""
    state = new_state()
    times = {}
    for key, fn in compiled.items():
        run_step(fn, state, batch)
        times[key] = []
    for _ in range(steps):
        for key, fn in compiled.items():
            times[key].append(run_step(fn, state, batch))
    return {key: float(np.median(t)) for key, t in times.items()}


def main() -> None:
    args = parse_args()
    cfg = train_shape_config(args)
    optim = OptimConfig(lr=1e-5)
    graphdef, abstract = nnx.split(nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0))), nnx.Param)
    param_shapes = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, np.float32), abstract.to_pure_dict())
    opt_shapes = jax.eval_shape(make_optimizer(optim).init, param_shapes)
    host_batch = make_batch(args)
    tokens = args.rows * args.seq
    step = jax.jit(train_step, static_argnames=("graphdef", "cfg", "decay_paths"),
                   donate_argnames=("params", "opt_state"))

    rows, compiled = [], {}
    for remat in args.remat:
        for chunk in args.chunks:
            tcfg = TrainerConfig(optim=optim, compute_dtype=args.dtype, remat=remat, logits_chunk=chunk)
            t = time.perf_counter()
            fn = step.lower(graphdef, param_shapes, opt_shapes, shapes(host_batch), cfg=tcfg,
                            decay_paths=None).compile()
            row = {"remat": remat, "logits_chunk": chunk, "compile_s": time.perf_counter() - t, **analyse(fn)}
            row["temp_bytes_per_token"] = row["temp_bytes"] / tokens
            print(f"remat={remat} logits_chunk={chunk}: compiled in {row['compile_s']:.1f} s, "
                  f"temp {row['temp_bytes'] / MIB:.1f} MiB", flush=True)
            rows.append(row)
            if not args.analysis_only:
                compiled[(remat, chunk)] = fn

    if compiled:
        batch = jax.device_put(host_batch, jax.devices()[0])
        step_s = time_settings(compiled, lambda: make_state(cfg, optim), batch, args.steps)
        for row in rows:
            row["step_s"] = step_s[(row["remat"], row["logits_chunk"])]

    by_key = {(r["remat"], r["logits_chunk"]): r for r in rows}
    ref = rows[0]  # the first remat with the first chunk: none / 0 by default
    for r in rows:
        whole = by_key.get((r["remat"], 0))
        r["temp_vs_whole"] = whole and r["temp_bytes"] / max(whole["temp_bytes"], 1)
        r["temp_vs_ref"] = r["temp_bytes"] / max(ref["temp_bytes"], 1)
        if "step_s" in r:
            r["time_vs_ref"] = r["step_s"] / ref["step_s"]
    print_table(rows, f"{ref['remat']}/{ref['logits_chunk']}")
    result = {
        "device": str(jax.devices()[0].device_kind), "layers": cfg.num_layers, "hidden": cfg.hidden_size,
        "vocab": cfg.vocab_size, "dtype": args.dtype, "rows": args.rows, "seq": args.seq, "tokens": tokens,
        "params": int(sum(x.size for x in jax.tree.leaves(param_shapes))),
        "ref": {"remat": ref["remat"], "logits_chunk": ref["logits_chunk"]}, "settings": rows,
    }
    print(json.dumps(result))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)


def print_table(rows: list[dict], ref: str) -> None:
    print(f"{'remat':>9} {'chunk':>6} {'temp MiB':>9} {'KiB/tok':>8} {'vs chunk 0':>10} {'vs ' + ref:>10} "
          f"{'step s':>7} {'time vs ' + ref:>14} {'compile s':>9}")
    for r in rows:
        vs_whole = f"{r['temp_vs_whole']:>10.2f}" if r["temp_vs_whole"] else f"{'-':>10}"
        run = f"{r['step_s']:>7.3f} {r['time_vs_ref']:>14.2f}" if "step_s" in r else f"{'-':>7} {'-':>14}"
        print(f"{r['remat']:>9} {r['logits_chunk']:>6} {r['temp_bytes'] / MIB:>9.1f} "
              f"{r['temp_bytes_per_token'] / 1024:>8.1f} {vs_whole} {r['temp_vs_ref']:>10.2f} {run} "
              f"{r['compile_s']:>9.1f}")


if __name__ == "__main__":
    main()
