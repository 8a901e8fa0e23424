"""engine=jax vs engine=vllm on one CPU: generation tokens/s and weight-push latency, side by side.

    /work/vllm-venv/bin/python benchmarks/bench_vllm.py [--requests 16 --n 4 --tokens 64 --pushes 3]

Same tiny random Llama (head_dim 64, float32) in both engines, same requests (sampled at
temperature 1, no stop token, so every sample generates exactly --tokens tokens). Each engine
first runs a warm-up batch (JIT compiles / vLLM warm-up), then the timed batch. Weight pushes
are timed end to end through `update_weights` (check + conversion + transport + version), per
transport for vLLM. Prints a table and the ratios vllm/jax.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")


def _cfg():
    from jaxrl_async.models import ModelConfig

    return ModelConfig.tiny(hidden_size=128, intermediate_size=256, num_heads=2, num_kv_heads=1,
                            head_dim=64, max_position_embeddings=1024)


async def _batch(engine, tag: str, args) -> tuple[int, float]:
    from jaxrl_async.engines.base import GenerationRequest, SamplingParams

    left = args.requests * args.n
    tokens = 0

    async def read():
        nonlocal left, tokens
        async for out in engine.outputs():
            tokens += len(out.token_ids)
            left -= out.done
            if not left:
                return

    reader = asyncio.create_task(read())
    start = time.perf_counter()
    for i in range(args.requests):
        await engine.submit(GenerationRequest(f"{tag}{i}", [256, 1 + i, 2, 3], SamplingParams(
            max_new_tokens=args.tokens, temperature=1.0, n=args.n, seed=i)))
    await reader
    return tokens, time.perf_counter() - start


async def _measure(engine, args, params) -> dict:
    await engine.start()
    await _batch(engine, "warm", args)
    tokens, seconds = await _batch(engine, "run", args)
    pushes = []
    for v in range(1, args.pushes + 1):
        start = time.perf_counter()
        await engine.update_weights(params, v)
        pushes.append(time.perf_counter() - start)
    return {"tok_s": tokens / seconds, "tokens": tokens, "push_s": min(pushes)}


async def main(args) -> None:
    from flax import nnx

    from jaxrl_async.engines.jax.config import EngineConfig
    from jaxrl_async.engines.jax.engine import JaxEngine
    from jaxrl_async.engines.vllm.config import VllmEngineConfig
    from jaxrl_async.engines.vllm.engine import make_engine
    from jaxrl_async.models import Transformer
    from jaxrl_async.models.loading import LoadedModel

    cfg = _cfg()
    params = nnx.to_pure_dict(nnx.state(Transformer(cfg, rngs=nnx.Rngs(1)), nnx.Param))
    slots = args.requests * args.n
    rows = {}

    jax_engine = JaxEngine(Transformer(cfg, rngs=nnx.Rngs(0)), cfg,
                           EngineConfig(num_slots=slots, max_len=args.tokens + 16, min_bucket=16))
    rows["jax"] = await _measure(jax_engine, args, params)
    await jax_engine.stop()

    loaded = LoadedModel(cfg, Transformer(cfg, rngs=nnx.Rngs(0)), None, None)
    for transport in ("memory", "disk"):
        options = {"directory": tempfile.mkdtemp(prefix="bench-weights-")} if transport == "disk" else {}
        engine = make_engine(VllmEngineConfig(max_num_seqs=slots, max_model_len=1024, transport=transport,
                                              transport_options=options, kv_cache_memory_bytes=128 << 20), loaded)
        rows[f"vllm/{transport}"] = await _measure(engine, args, params)
        await engine.stop()

    print(f"\n{'engine':<14}{'tokens/s':>12}{'push ms':>10}   ({args.requests} requests x n={args.n} x "
          f"{args.tokens} tokens, {args.pushes} pushes, min)")
    for name, r in rows.items():
        print(f"{name:<14}{r['tok_s']:>12.0f}{r['push_s'] * 1e3:>10.1f}")
    base = rows["jax"]
    for name, r in rows.items():
        if name != "jax":
            print(f"ratio {name}/jax: tokens/s x{r['tok_s'] / base['tok_s']:.2f}, "
                  f"push latency x{r['push_s'] / base['push_s']:.2f}")


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--requests", type=int, default=16)
    p.add_argument("--n", type=int, default=4)
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--pushes", type=int, default=3)
    asyncio.run(main(p.parse_args()))
