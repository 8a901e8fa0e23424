"""Train-step throughput as a fraction of the machine's measured matmul FLOP/s.

Measures, in one run and side by side:
- the peak we can reach: FLOP/s of `jnp.dot` on large square matrices (in the compute dtype);
- the train step's achieved FLOP/s, counting 6 * matmul_params * tokens (forward + backward of
  every weight matrix; the input embedding is a gather, not a matmul, so it is left out unless
  tied) plus attention 12 * layers * T^2 * heads * head_dim per sequence (QK^T and AV, forward
  and backward, without the causal halving — the usual MFU convention);
- the step's compile time (first call minus the median steady call);
- the bare model's forward + backward (gradient of the summed token log-probs) on the same
  batch, so that `step_over_fwd_bwd` shows what the step adds (loss, accumulation, optimizer).

Not a test: `python benchmarks/bench_train_step.py [--layers 4 --hidden 256 ...]`.
Prints a table and one JSON line.
"""

from __future__ import annotations

import argparse
import json
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxrl_async.models.config import ModelConfig
from train_shape import add_train_shape_args, train_shape_config  # benchmarks/, beside this script
from jaxrl_async.models.transformer import Transformer
from jaxrl_async.trainer.batch import pad_batch
from jaxrl_async.trainer.config import TrainerConfig
from jaxrl_async.trainer.optim import OptimConfig
from jaxrl_async.trainer.step import sequence_logprobs
from jaxrl_async.trainer.trainer import Trainer


def matmul_flops(n: int, dtype: str, repeats: int) -> float:
    a = jax.random.normal(jax.random.key(0), (n, n), jnp.float32).astype(dtype)
    dot = jax.jit(jnp.dot)
    dot(a, a).block_until_ready()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        dot(a, a).block_until_ready()
        times.append(time.perf_counter() - t)
    return 2 * n ** 3 / float(np.median(times))


def step_flops(cfg: ModelConfig, params: dict, rows: int, seq: int) -> float:
    """Model FLOPs of one step (see the module docstring); norm scales are not matmul weights."""
    flat = jax.tree_util.tree_flatten_with_path(params)[0]
    matmul_params = sum(
        leaf.size for path, leaf in flat
        if "norm" not in jax.tree_util.keystr(path)
        and (jax.tree_util.keystr(path) != "['embed']" or cfg.tie_word_embeddings))
    attention = 12 * cfg.num_layers * seq * seq * cfg.num_heads * cfg.head_dim
    return 6 * matmul_params * rows * seq + attention * rows


def median_seconds(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - t)
    return float(np.median(times))


def fwd_bwd_seconds(trainer: Trainer, tokens: np.ndarray, dtype: str, repeats: int) -> float:
    def logprob_sum(params, tokens):
        return sequence_logprobs(trainer.graphdef, params, tokens, dtype)[0].sum()

    grad = jax.jit(jax.grad(logprob_sum))
    params, tokens = trainer.params(), jnp.asarray(tokens)
    jax.block_until_ready(grad(params, tokens))
    return median_seconds(lambda: grad(params, tokens), repeats)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_train_shape_args(ap)
    ap.add_argument("--microbatches", type=int, default=1)
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--matmul-n", type=int, default=2048)
    args = ap.parse_args()

    cfg = train_shape_config(args)
    trainer = Trainer(Transformer(cfg, rngs=nnx.Rngs(0)),
                      TrainerConfig(optim=OptimConfig(lr=1e-5), num_microbatches=args.microbatches,
                                    compute_dtype=args.dtype))
    rng = np.random.default_rng(0)
    prompt = args.seq // 4
    samples = [(list(rng.integers(0, args.vocab, prompt)), list(rng.integers(0, args.vocab, args.seq - prompt)),
                list(-rng.uniform(5, 9, args.seq - prompt)), float(rng.random()), i // 4)
               for i in range(args.rows)]
    batch = pad_batch(samples, buckets=[args.seq])

    t = time.perf_counter()
    trainer.step(batch)  # compile + run; metrics are fetched, so the step has finished
    first = time.perf_counter() - t
    step_s = median_seconds(lambda: trainer.step(batch), args.steps)
    fwd_bwd_s = fwd_bwd_seconds(trainer, batch.tokens, args.dtype, args.steps)

    peak = matmul_flops(args.matmul_n, args.dtype, repeats=5)
    flops = step_flops(cfg, trainer.params(copy=False), args.rows, args.seq)
    achieved = flops / step_s
    n_params = sum(x.size for x in jax.tree.leaves(trainer.params(copy=False)))
    result = {
        "device": str(jax.devices()[0].device_kind), "dtype": args.dtype, "params": int(n_params),
        "rows": args.rows, "seq": args.seq, "microbatches": args.microbatches,
        "matmul_tflops": peak / 1e12, "step_s": step_s, "step_tflops": achieved / 1e12,
        "fraction_of_matmul": achieved / peak, "tokens_per_s": args.rows * args.seq / step_s,
        "compile_s": first - step_s, "model_fwd_bwd_s": fwd_bwd_s,
        "step_over_fwd_bwd": step_s / fwd_bwd_s,
    }
    for k, v in result.items():
        print(f"{k:>20}: {v:.4g}" if isinstance(v, float) else f"{k:>20}: {v}")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
