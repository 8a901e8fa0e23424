"""The JAX engine's decode call: step time vs live context, and tokens/s vs steps per call.

Measures, in one run and side by side (configurations alternate round by round, so all see the
same machine load; medians of `--repeats` rounds):
- step time vs live context at a fixed `--max-len` (batch `--ctx-batch`): each slot at position
  live - 1, one decode step attending over the whole cache ("full": the engine without live
  buckets) and over the live bucket only ("live": what the engine does now);
- tokens/s of `engine_decode_steps` for k = `--ks` decode steps per call at batch 1 and 32
  (`--batches`), slots at position `--position`, each call ending with its tokens on the host
  (the engine's round trip); tokens/s = batch * k / call time;
- the fraction of the memory roofline: (weight bytes + live KV bytes read per step) / step time,
  divided by a device copy bandwidth measured here (a jitted `x + 1` over `--copy-mib` MiB:
  reads and writes it once).

Random weights (the step's cost does not depend on their values); greedy sampling; nothing
stops early. Only jax, flax and numpy are imported (no hydra, torch or transformers), so it runs
on a bare accelerator machine:

    python benchmarks/bench_decode.py                       # tiny shape, CPU-sized
    python benchmarks/bench_decode.py --shape qwen2.5-1.5b  # Qwen2.5-1.5B shape, bf16

Prints two tables and one JSON line.
"""

from __future__ import annotations

import argparse
import json
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxrl_async.engines.jax.steps import engine_decode_steps
from jaxrl_async.models.attention import init_cache
from jaxrl_async.models.config import ModelConfig
from jaxrl_async.models.transformer import Transformer, inference_weights

SHAPES = {
    # Big enough that a CPU step is not all dispatch overhead, small enough for 2 cores.
    "tiny": dict(vocab_size=4096, hidden_size=256, intermediate_size=768, num_layers=4, num_heads=4,
                 num_kv_heads=2, head_dim=64, max_position_embeddings=4096),
    "qwen2.5-1.5b": dict(vocab_size=151936, hidden_size=1536, intermediate_size=8960, num_layers=28,
                         num_heads=12, num_kv_heads=2, head_dim=128, attention_bias=True,
                         tie_word_embeddings=True, rope_theta=1e6, max_position_embeddings=32768,
                         dtype="bfloat16"),
}

decode = jax.jit(engine_decode_steps, static_argnums=(0, 1, 2), donate_argnums=4)


def bucket(n: int, max_len: int, smallest: int = 16) -> int:
    """The engine's attention length for positions < n: a power of two >= n, capped at max_len."""
    b = smallest
    while b < n:
        b *= 2
    return min(b, max_len)


def slot_inputs(batch: int, position: int, k: int) -> tuple:
    z = np.zeros(batch, np.int32)
    return (z + 1, z + position, z.astype(np.uint32), z, z, z.astype(np.float32), z + np.float32(1.0), z,
            z + k, np.full((batch, 4), -1, np.int32))


class Case:
    """One decode configuration: its own cache, timed call by call."""

    def __init__(self, cfg: ModelConfig, weights: dict, batch: int, max_len: int, length: int,
                 k: int, position: int):
        self.cfg, self.weights, self.length, self.k = cfg, weights, length, k
        self.cache = init_cache(cfg, batch, max_len)
        self.inputs = slot_inputs(batch, position, k)
        self.times: list[float] = []

    def call(self) -> float:
        start = time.perf_counter()
        self.cache, tokens, _, count, _ = decode(self.cfg, self.length, self.k, self.weights, self.cache,
                                                 *self.inputs)
        np.asarray(tokens), np.asarray(count)  # the engine reads both on the host every call
        return time.perf_counter() - start

    def median(self) -> float:
        return float(np.median(self.times))


def rounds(cases: list[Case], repeats: int) -> None:
    for case in cases:  # compile and warm up
        case.call()
    for _ in range(repeats):
        for case in cases:
            case.times.append(case.call())


def copy_bandwidth(mib: int, repeats: int) -> float:
    """Bytes/s of a jitted elementwise pass over `mib` MiB (read once, written once)."""
    x = jnp.ones((mib * 2**20 // 4,), jnp.float32)
    f = jax.jit(lambda x: x + 1.0)
    f(x).block_until_ready()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        f(x).block_until_ready()
        times.append(time.perf_counter() - start)
    return 2 * x.nbytes / float(np.median(times))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="tiny")
    parser.add_argument("--max-len", type=int, default=2048)
    parser.add_argument("--lives", type=int, nargs="+", default=[64, 256, 1024, 2048])
    parser.add_argument("--ctx-batch", type=int, default=32)
    parser.add_argument("--ks", type=int, nargs="+", default=[1, 4, 8, 16])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--position", type=int, default=200, help="slot position in the k table")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--copy-mib", type=int, default=1024)
    args = parser.parse_args()

    cfg = ModelConfig(**SHAPES[args.shape])
    model = Transformer(cfg, rngs=nnx.Rngs(0))
    weights = jax.jit(inference_weights)(nnx.to_pure_dict(nnx.state(model, nnx.Param)))
    del model
    weight_bytes = sum(x.nbytes for x in jax.tree.leaves(weights))
    kv_bytes_per_position = 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * jnp.dtype(cfg.dtype).itemsize
    bandwidth = copy_bandwidth(args.copy_mib, args.repeats)

    def roofline(batch: int, length: int, step_s: float) -> float:
        return (weight_bytes + batch * length * kv_bytes_per_position) / step_s / bandwidth

    ctx = {(live, mode): Case(cfg, weights, args.ctx_batch, args.max_len,
                              args.max_len if mode == "full" else bucket(live, args.max_len), 1, live - 1)
           for live in args.lives for mode in ("full", "live")}
    rounds(list(ctx.values()), args.repeats)
    ks = {(b, k): Case(cfg, weights, b, args.max_len, bucket(args.position + k, args.max_len), k, args.position)
          for b in args.batches for k in args.ks}
    rounds(list(ks.values()), args.repeats)

    print(f"{args.shape}: weights {weight_bytes / 2**20:.1f} MiB, copy bandwidth {bandwidth / 1e9:.1f} GB/s, "
          f"{jax.devices()[0].device_kind}")
    print(f"\nstep time vs live context (max_len {args.max_len}, batch {args.ctx_batch}, k=1)")
    print(f"{'live':>6} {'L':>6} {'full ms':>9} {'live ms':>9} {'speedup':>8} {'roofline full':>14} {'roofline live':>14}")
    rows = []
    for live in args.lives:
        full, mine = ctx[live, "full"], ctx[live, "live"]
        row = dict(live=live, length=mine.length, full_ms=1e3 * full.median(), live_ms=1e3 * mine.median(),
                   roofline_full=roofline(args.ctx_batch, live, full.median()),
                   roofline_live=roofline(args.ctx_batch, live, mine.median()))
        rows.append(row)
        print(f"{live:>6} {mine.length:>6} {row['full_ms']:>9.2f} {row['live_ms']:>9.2f} "
              f"{row['full_ms'] / row['live_ms']:>7.2f}x {row['roofline_full']:>14.3f} {row['roofline_live']:>14.3f}")
    print(f"\ntokens/s vs decode steps per call (position {args.position})")
    print(f"{'batch':>6} {'k':>4} {'L':>6} {'call ms':>9} {'step ms':>9} {'tokens/s':>10} {'vs k=1':>7} {'roofline':>9}")
    krows = []
    for b in args.batches:
        base = None
        for k in args.ks:
            case = ks[b, k]
            step_s = case.median() / k
            tps = b / step_s
            base = base or tps
            row = dict(batch=b, k=k, length=case.length, call_ms=1e3 * case.median(), tokens_per_s=tps,
                       roofline=roofline(b, args.position, step_s))
            krows.append(row)
            print(f"{b:>6} {k:>4} {case.length:>6} {row['call_ms']:>9.2f} {1e3 * step_s:>9.2f} {tps:>10.1f} "
                  f"{tps / base:>6.2f}x {row['roofline']:>9.3f}")
    print(json.dumps(dict(shape=args.shape, device=jax.devices()[0].device_kind, max_len=args.max_len,
                          weight_bytes=weight_bytes, copy_bandwidth=bandwidth, context=rows, steps_per_call=krows)))


if __name__ == "__main__":
    main()
