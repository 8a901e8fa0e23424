"""JAX engine decode throughput vs `transformers` generate (torch, CPU) on SmolLM2-135M.

Measures, in one run and side by side (the two alternate, so both see the same machine load):
- tokens/s of the JAX `EngineCore` (continuous batching over `batch` slots, greedy, no stop
  token, prefill included) and of `transformers` `generate` (greedy, `min_new_tokens` =
  `max_new_tokens`, same weights: the dequantized GGUF written as HF safetensors, float32);
- batch 1 and batch 32 (default), medians of 3 runs, and the ratio JAX / torch;
- the engine's compile time (`EngineCore.warmup`: every prefill bucket and the decode step);
- how many greedy tokens agree between the two (a sanity check, not a test: float32 sums in a
  different order can flip a near-tie and the sequences then diverge);
- the matmul floor: the decode step's matmuls alone (every layer's projections and the LM head
  on a [batch, hidden] input, one jitted chain over the engine's weights) — no JAX decode step
  on this machine can beat it with XLA's CPU dots, so `ceiling_ratio` = (batch / floor) / torch
  tokens/s bounds the ratio any decode step could reach here (prefill aside).

Not a test: `python benchmarks/bench_engine.py [--batches 1 32 --prompt-len 32 --new 64]`;
on a GPU machine add `--torch-device cuda` (JAX runs on its default backend).
Prints a table and one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np
import torch
from flax import nnx
from transformers import AutoModelForCausalLM

from jaxrl_async.engines.base import GenerationRequest, SamplingParams
from jaxrl_async.engines.jax.config import EngineConfig
from jaxrl_async.engines.jax.core import EngineCore
from jaxrl_async.models.hf_weights import save_hf
from jaxrl_async.models.loading import load_model
from jaxrl_async.models.transformer import dense, inference_weights


def engine_run(core: EngineCore, prompts: np.ndarray, new: int, tag: str) -> tuple[float, np.ndarray]:
    for i, prompt in enumerate(prompts):
        core.submit(GenerationRequest(f"{tag}-{i}", prompt.tolist(), SamplingParams(new, temperature=0.0)))
    out: dict[int, list[int]] = {}
    start = time.perf_counter()
    while core.has_work():
        for piece in core.step():
            out[int(piece.request_id.rsplit("-", 1)[1])] = piece.token_ids
    elapsed = time.perf_counter() - start
    return elapsed, np.asarray([out[i] for i in range(len(prompts))])


def matmul_floor_s(weights: dict, batch: int, repeats: int) -> float:
    """Median seconds of one decode step's matmuls alone (see the module docstring)."""

    @jax.jit
    def chain(weights, x):
        for p in weights["layers"]:
            q, k, v = dense(x, p["wq"]), dense(x, p["wk"]), dense(x, p["wv"])
            x = x + dense(q, p["wo"], in_axes=2) + 0.0 * (k.sum() + v.sum())  # keep k, v live
            x = x + dense(dense(x, p["w_gate"]) * dense(x, p["w_up"]), p["w_down"])
        return jnp.dot(x, weights["embed"].T)

    x = jnp.ones((batch, weights["embed"].shape[1]), weights["embed"].dtype)
    jax.block_until_ready(chain(weights, x))
    times = []
    for _ in range(max(repeats, 5)):
        start = time.perf_counter()
        jax.block_until_ready(chain(weights, x))
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def torch_run(model, prompts: np.ndarray, new: int) -> tuple[float, np.ndarray]:
    ids = torch.from_numpy(prompts.astype(np.int64)).to(model.device)
    start = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                             max_new_tokens=new, min_new_tokens=new, pad_token_id=0)
        tokens = out[:, prompts.shape[1]:].cpu().numpy()  # waits for the device
    return time.perf_counter() - start, tokens


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 32])
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--torch-device", default="cpu",
                    help="where transformers runs (cuda on a GPU machine; JAX uses its default backend)")
    args = ap.parse_args()
    torch.set_num_threads(os.cpu_count())

    loaded = load_model("smollm2_135m", dtype="float32")
    with tempfile.TemporaryDirectory() as tmp:
        save_hf(loaded.model, loaded.cfg, tmp)
        hf = AutoModelForCausalLM.from_pretrained(tmp, dtype=torch.float32).eval().to(args.torch_device)
    weights = jax.jit(inference_weights)(nnx.to_pure_dict(nnx.state(loaded.model, nnx.Param)))
    rng = np.random.default_rng(0)
    max_len = 1 << (args.prompt_len + args.new - 1).bit_length()  # next power of two
    results = []
    for batch in args.batches:
        prompts = rng.integers(100, loaded.cfg.vocab_size, (batch, args.prompt_len))
        core = EngineCore(loaded.model, loaded.cfg,
                          EngineConfig(num_slots=batch, max_len=max_len, min_bucket=16))
        start = time.perf_counter()
        core.warmup()
        compile_s = time.perf_counter() - start
        torch_run(hf, prompts[:, :4], 2)  # torch warm-up (allocator, kernels)
        jax_s, torch_s = [], []
        for r in range(args.repeats):
            t, jax_tokens = engine_run(core, prompts, args.new, f"b{batch}r{r}")
            jax_s.append(t)
            t, torch_tokens = torch_run(hf, prompts, args.new)
            torch_s.append(t)
        tokens = batch * args.new
        row = {"batch": batch, "new_tokens": args.new, "prompt_len": args.prompt_len,
               "jax_tok_s": tokens / float(np.median(jax_s)),
               "torch_tok_s": tokens / float(np.median(torch_s)),
               "engine_compile_s": compile_s,
               "greedy_agreement": float(np.mean(np.cumprod(jax_tokens == torch_tokens, axis=1)))}
        row["ratio"] = row["jax_tok_s"] / row["torch_tok_s"]
        row["matmul_floor_ms"] = 1e3 * matmul_floor_s(weights, batch, args.repeats)
        row["ceiling_ratio"] = batch / (row["matmul_floor_ms"] / 1e3) / row["torch_tok_s"]
        results.append(row)
        print(f"batch {batch:3d}: jax {row['jax_tok_s']:8.1f} tok/s   torch {row['torch_tok_s']:8.1f} tok/s   "
              f"ratio {row['ratio']:5.2f}   engine compile {compile_s:5.1f}s   "
              f"greedy prefix agreement {row['greedy_agreement']:.2f}   matmul floor "
              f"{row['matmul_floor_ms']:.1f} ms/step (ceiling ratio {row['ceiling_ratio']:.2f})", flush=True)
    print(json.dumps({"device": str(jax.devices()[0]), "cpus": os.cpu_count(), "results": results}))


if __name__ == "__main__":
    main()
