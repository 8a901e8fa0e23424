"""Paged vs contiguous KV cache in the JAX engine: capacity at a fixed KV budget, and decode step time.

Measures, in one run and side by side:
- capacity (`--budget-seqs` x `--max-len` KV positions, the same bytes for both): the contiguous
  engine reserves max_len positions per slot, so it holds budget-seqs sequences; the paged engine
  (`engine.page_size`, kv_pages = the same positions) holds what the live sequences use. A
  heavy-tailed length mix (Pareto type I, as planner's `heavy_tail` workload: lengths
  `--scale` * (1 + pareto(`--alpha`)), clipped at max_len - prompt) of groups of `--n` samples
  runs to the end through each engine's real `step()` on the tiny model (greedy, no stop token, so
  a sample's length is its max_new_tokens). Reported as means over decode calls: sequences
  decoding (while requests wait in the queue — the capacity — and over the whole run, whose tail
  has few left), KV bytes reserved (contiguous: admitted slots x max_len; paged: pages held) and
  used (positions holding keys and values, a shared prompt page once), and the wall time and
  decode calls to finish the mix (the decode batch is num_slots whatever the occupancy, so a
  64-slot paged engine computes 64 rows per step);
- decode step time vs live tokens vs max_len: one `engine_decode_steps` call (k=1, batch
  `--batch`, every slot at position live - 1) over a contiguous cache (the attention length the
  contiguous engine uses: the live bucket up to max_len / 4 on CPU, else max_len) and over a paged
  one (the live pages only), on bench_decode.py's tiny shape; medians of `--repeats` calls,
  configurations alternating round by round.

Only jax, flax and numpy are imported, so it runs on a bare accelerator machine:

    python benchmarks/bench_kv_paging.py                     # CPU-sized
    python benchmarks/bench_kv_paging.py --max-lens 2048 8192 --lives 64 512 2048 --batch 64   # GPU

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

from bench_decode import SHAPES, bucket, slot_inputs  # benchmarks/, beside this script
from jaxrl_async.engines.base import GenerationRequest, SamplingParams
from jaxrl_async.engines.jax.compiles import LIVE_BUCKET_LIMITS
from jaxrl_async.engines.jax.config import EngineConfig
from jaxrl_async.engines.jax.engine import make_core
from jaxrl_async.engines.jax.paged_attention import IMPLEMENTATIONS, init_paged_cache, kernel_for
from jaxrl_async.engines.jax.steps import engine_decode_steps
from jaxrl_async.models.attention import init_cache
from jaxrl_async.models.config import ModelConfig
from jaxrl_async.models.transformer import Transformer, inference_weights

decode = jax.jit(engine_decode_steps, static_argnums=(0, 1, 2), static_argnames="kernel", donate_argnums=4)


def heavy_tail_lengths(rng: np.random.Generator, groups: int, scale: float, alpha: float, cap: int) -> list[int]:
    return [int(min(cap, max(1, scale * (1.0 + rng.pareto(alpha))))) for _ in range(groups)]


def capacity(args, model, cfg: ModelConfig, paged: bool) -> dict:
    """Run the length mix through one engine; per decode call, what it holds and uses."""
    budget = args.budget_seqs * args.max_len
    ps = args.page_size
    config = EngineConfig(num_slots=args.paged_slots if paged else args.budget_seqs, max_len=args.max_len,
                          min_bucket=16, decode_steps_per_call=args.k,
                          page_size=ps if paged else 0, kv_pages=budget // ps if paged else None)
    core = make_core(model, cfg, config)
    if paged:
        core.kernel = args.kernel
    core.warmup()
    rng = np.random.default_rng(args.seed)
    lengths = heavy_tail_lengths(rng, args.groups, args.scale, args.alpha, args.max_len - args.prompt)
    for g, new in enumerate(lengths):
        prompt = rng.integers(0, cfg.vocab_size, args.prompt).tolist()
        core.submit(GenerationRequest(f"g{g}", prompt, SamplingParams(new, temperature=0.0, n=args.n)))
    active, backlogged, reserved, used = [], [], [], []
    start = time.perf_counter()
    while core.has_work():
        core.step()
        live = [s for s in core.slots.seqs if s is not None]
        active.append(len(live))
        backlogged.append(core.queued > 0)
        used.append(stored_positions(core, paged))
        reserved.append(core.pages.pool.used * ps if paged else len(live) * args.max_len)
    seconds = time.perf_counter() - start
    bytes_per_position = 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * jnp.dtype(cfg.dtype).itemsize
    busy = [i for i, a in enumerate(active) if a]
    return dict(mode="paged" if paged else "contiguous", slots=config.num_slots,
                budget_bytes=budget * bytes_per_position,
                mean_sequences=float(np.mean([active[i] for i in busy])), peak_sequences=max(active),
                backlogged_sequences=float(np.mean([a for a, b in zip(active, backlogged) if b])),
                mean_reserved_bytes=float(np.mean([reserved[i] for i in busy])) * bytes_per_position,
                mean_used_bytes=float(np.mean([used[i] for i in busy])) * bytes_per_position,
                decode_calls=core.counters["decode_calls"], seconds=seconds,
                preemptions=core.counters["preemptions"], samples=sum(1 for _ in lengths) * args.n,
                mean_length=float(np.mean(lengths)) + args.prompt)


def stored_positions(core, paged: bool) -> int:
    """KV positions holding a live sample's keys and values: a contiguous slot stores its own
    copy of the prompt; a page shared by a group's samples is counted once."""
    if not paged:
        return sum(s.position for s in core.slots.seqs if s is not None)
    ps, filled = core.config.page_size, {}
    for slot, seq in enumerate(core.slots.seqs):
        if seq is not None:
            for j, page in enumerate(core.pages.pages[slot]):
                filled[page] = max(filled.get(page, 0), min(ps, max(0, seq.position - j * ps)))
    return sum(filled.values())


class StepCase:
    """One decode configuration (contiguous or paged) with its own cache, timed call by call."""

    def __init__(self, cfg, weights, batch: int, max_len: int, live: int, page_size: int, platform: str,
                 kernel: str):
        self.cfg, self.weights, self.times = cfg, weights, []
        self.inputs = slot_inputs(batch, live - 1, 1)
        if page_size:
            pages_per_slot = max_len // page_size
            self.cache = init_paged_cache(cfg, batch * pages_per_slot, page_size)
            self.kwargs = dict(page_table=np.arange(batch * pages_per_slot, dtype=np.int32).reshape(batch, -1),
                               kernel=kernel)
            self.length = -(-bucket(live, max_len) // page_size) * page_size
        else:
            self.cache = init_cache(cfg, batch, max_len)
            self.kwargs = {}
            length = bucket(live, max_len)
            limit = LIVE_BUCKET_LIMITS.get(platform, LIVE_BUCKET_LIMITS["cpu"])(max_len)
            self.length = length if length <= limit else max_len

    def call(self) -> float:
        start = time.perf_counter()
        self.cache, tokens, _, count, _ = decode(self.cfg, self.length, 1, self.weights, self.cache,
                                                 *self.inputs, **self.kwargs)
        np.asarray(tokens), np.asarray(count)
        return time.perf_counter() - start


def kernel_difference() -> float:
    """The compiled Pallas kernel against the XLA gather on random pages (bf16 as on a GPU)."""
    rng = np.random.default_rng(0)
    s, h, kv, d, ps, pages, n = 8, 12, 2, 128, 16, 64, 6
    k_pages = jnp.asarray(rng.normal(size=(pages, kv, d, ps)), jnp.bfloat16)
    v_pages = jnp.asarray(rng.normal(size=(pages, kv, ps, d)), jnp.bfloat16)
    table = jnp.asarray(rng.permutation(pages)[:s * n].reshape(s, n), jnp.int32)
    q = jnp.asarray(rng.normal(size=(s, 1, h, d)), jnp.bfloat16)
    positions = jnp.asarray(rng.integers(0, n * ps, s), jnp.int32)
    want = IMPLEMENTATIONS["xla"](q, k_pages, v_pages, table, positions).astype(jnp.float32)
    got = jax.jit(IMPLEMENTATIONS["pallas"])(q, k_pages, v_pages, table, positions).astype(jnp.float32)
    return float(jnp.max(jnp.abs(got - want)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-len", type=int, default=512, help="capacity: KV positions per sequence")
    parser.add_argument("--budget-seqs", type=int, default=8, help="capacity: KV budget in max_len sequences")
    parser.add_argument("--paged-slots", type=int, default=64, help="capacity: the paged engine's decode batch")
    parser.add_argument("--page-size", type=int, default=16)
    parser.add_argument("--groups", type=int, default=40)
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--prompt", type=int, default=40)
    parser.add_argument("--scale", type=float, default=24.0)
    parser.add_argument("--alpha", type=float, default=1.5)
    parser.add_argument("--k", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--shape", choices=sorted(SHAPES), default="tiny", help="step time: model shape")
    parser.add_argument("--max-lens", type=int, nargs="+", default=[512, 2048])
    parser.add_argument("--lives", type=int, nargs="+", default=[64, 256, 1024])
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--kernel", choices=["auto", *IMPLEMENTATIONS], default="auto",
                        help="paged attention implementation (auto: the backend's, paged_attention.KERNELS)")
    args = parser.parse_args()
    platform = jax.devices()[0].platform
    args.kernel = kernel_for(platform) if args.kernel == "auto" else args.kernel
    if args.kernel == "pallas" and platform != "cpu":
        print(f"pallas vs xla paged attention, max |difference|: {kernel_difference():.2e}")

    cfg = ModelConfig.tiny(max_position_embeddings=max(args.max_len, 1024))
    model = Transformer(cfg, rngs=nnx.Rngs(0))
    cap = [capacity(args, model, cfg, paged) for paged in (False, True)]
    print(f"capacity at a KV budget of {args.budget_seqs} x max_len {args.max_len} positions "
          f"({cap[0]['budget_bytes'] / 2**20:.2f} MiB, tiny model), {cap[0]['samples']} samples "
          f"(groups of {args.n}), heavy-tailed lengths: mean {cap[0]['mean_length']:.0f} positions, "
          f"page_size {args.page_size}, k={args.k}")
    print(f"{'mode':>11} {'slots':>6} {'backlogged':>11} {'mean seqs':>10} {'peak':>5} {'reserved MiB':>13} "
          f"{'used MiB':>9} {'used/resv':>10} {'calls':>6} {'seconds':>8} {'preempt':>8}")
    for row in cap:
        print(f"{row['mode']:>11} {row['slots']:>6} {row['backlogged_sequences']:>11.1f} "
              f"{row['mean_sequences']:>10.1f} {row['peak_sequences']:>5} "
              f"{row['mean_reserved_bytes'] / 2**20:>13.2f} {row['mean_used_bytes'] / 2**20:>9.2f} "
              f"{row['mean_used_bytes'] / row['mean_reserved_bytes']:>10.2f} {row['decode_calls']:>6} "
              f"{row['seconds']:>8.1f} {row['preemptions']:>8}")
    print(f"paged / contiguous: {cap[1]['backlogged_sequences'] / cap[0]['backlogged_sequences']:.2f}x the "
          f"sequences decoding at once while requests wait ({cap[1]['mean_sequences'] / cap[0]['mean_sequences']:.2f}x "
          f"over the whole run), {cap[0]['seconds'] / cap[1]['seconds']:.2f}x the speed to finish the mix")

    scfg = ModelConfig(**SHAPES[args.shape])
    smodel = Transformer(scfg, rngs=nnx.Rngs(0))
    weights = jax.jit(inference_weights)(nnx.to_pure_dict(nnx.state(smodel, nnx.Param)))
    del smodel
    cases = {(m, live, mode): StepCase(scfg, weights, args.batch, m, live, args.page_size if mode == "paged" else 0,
                                       platform, args.kernel)
             for m in args.max_lens for live in args.lives if live <= m for mode in ("contiguous", "paged")}
    for case in cases.values():  # compile and warm up
        case.call()
    for _ in range(args.repeats):
        for case in cases.values():
            case.times.append(case.call())
    print(f"\ndecode step time vs live tokens vs max_len ({args.shape} shape, batch {args.batch}, k=1, "
          f"{jax.devices()[0].device_kind}, paged kernel {args.kernel})")
    print(f"{'max_len':>8} {'live':>6} {'contig L':>9} {'contig ms':>10} {'paged L':>8} {'paged ms':>9}")
    steps = []
    for (m, live, mode), case in cases.items():
        if mode == "paged":
            contig = cases[m, live, "contiguous"]
            row = dict(max_len=m, live=live, contiguous_length=contig.length,
                       contiguous_ms=1e3 * float(np.median(contig.times)), paged_length=case.length,
                       paged_ms=1e3 * float(np.median(case.times)))
            steps.append(row)
            print(f"{m:>8} {live:>6} {row['contiguous_length']:>9} {row['contiguous_ms']:>10.2f} "
                  f"{row['paged_length']:>8} {row['paged_ms']:>9.2f}")
    print(json.dumps(dict(device=jax.devices()[0].device_kind, capacity=cap, step_time=steps)))


if __name__ == "__main__":
    main()
