"""Speculative decoding in the JAX engine: decode tokens/s with and without it, and its acceptance.

For each batch size (`--batches`, default 1 and 4: the weight-bound tail) and each engine
configuration — plain decoding (`decode_steps_per_call` 8, the engine's default), the n-gram draft
(k = `--tokens`) and the self-draft `layers:N` (`--draft-layers`) — one engine core decodes the
first `batch` prompts of the built-in task (`--task`, default repeat_letter: the default training
run's), `--max-new-tokens` tokens each, at `--temperature`; tokens/s counts the emitted tokens over
the wall time of the steps (prefill included, compilation excluded: each configuration runs once
before it is timed). Configurations alternate round by round (`--repeats` rounds, medians), so all
see the same machine load. The acceptance rate is accepted / drafted tokens.

    python benchmarks/bench_speculation.py                          # the random tiny model
    python benchmarks/bench_speculation.py --checkpoint RUN_DIR     # a trained run's weights (RUN_DIR/hf)

The model is `--model` (a registered name or a HF directory, as `model.source`); `--checkpoint
RUN_DIR` loads the run's HF export (`RUN_DIR/hf`, what `python -m jaxrl_async.eval
model.source=RUN_DIR/hf` evaluates). Prints a table and one JSON line.

`--shape NAME` (bench_decode.py's shapes, e.g. qwen2.5-1.5b) measures the step costs instead, on
random weights (whose drafts would never be accepted, so acceptance is a parameter here): at
batch `--batch` (1) and position `--position`, the ms per token of plain decoding (16 steps a
call), the ms of one verify call of k + 1 positions (host drafts, the n-gram's case) and of one
self-draft call (`layers:N` drafting k then verifying), each ending with its tokens on the host;
and the ms per token they give at acceptance rates a = 0.5, 0.7, 0.9, where a verify call emits
(1 - a^(k+1)) / (1 - a) tokens on average. That is the GPU figure launch/device_check.sh asks for.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from jaxrl_async.engines.base import GenerationRequest, SamplingParams
from jaxrl_async.engines.jax.config import EngineConfig
from jaxrl_async.engines.jax.core import EngineCore
from jaxrl_async.engines.speculation import SpeculationConfig
from jaxrl_async.models.loading import load_model
from jaxrl_async.tasks import build_task


def configurations(args) -> dict[str, SpeculationConfig]:
    common = dict(when="always", tokens=args.tokens, max_active=max(args.batches))
    return {"plain": SpeculationConfig(),
            f"ngram k={args.tokens}": SpeculationConfig(method="ngram", ngram=args.ngram, **common),
            f"layers:{args.draft_layers} k={args.tokens}": SpeculationConfig(
                method="draft", draft_model=f"layers:{args.draft_layers}", **common)}


def decode(loaded, prompts: list[list[int]], spec: SpeculationConfig, args) -> dict:
    """One timed run: the prompts, one slot each. Returns tokens, seconds, drafted, accepted."""
    need = max(map(len, prompts)) + args.max_new_tokens
    core = EngineCore(loaded.model, loaded.cfg, EngineConfig(num_slots=len(prompts), max_len=need,
                                                             min_bucket=min(16, need), speculation=spec))
    params = SamplingParams(max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                            stop_token_ids=() if args.ignore_stop else loaded.stop_token_ids, seed=args.seed)
    for i, prompt in enumerate(prompts):
        core.submit(GenerationRequest(f"p{i}", prompt, params))
    start = time.perf_counter()
    while core.has_work():
        core.step()
    seconds = time.perf_counter() - start
    c = core.counters
    return {"tokens": c["tokens"], "seconds": seconds, "drafted": c["drafted"], "accepted": c["accepted"],
            "calls": c["decode_calls"]}


def step_costs(args) -> None:
    """The `--shape` mode (module docstring): plain, verify and self-draft call times, random weights."""
    import jax
    from flax import nnx

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_decode import SHAPES, bucket, decode, slot_inputs

    from jaxrl_async.engines.jax.speculative import engine_speculate
    from jaxrl_async.models.attention import init_cache
    from jaxrl_async.models.config import ModelConfig
    from jaxrl_async.models.transformer import Transformer, inference_weights

    cfg = ModelConfig(**SHAPES[args.shape])
    model = Transformer(cfg, rngs=nnx.Rngs(0))
    weights = jax.jit(inference_weights)(nnx.to_pure_dict(nnx.state(model, nnx.Param)))
    del model
    speculate = jax.jit(engine_speculate, static_argnums=(0, 1, 2, 3), donate_argnums=5)
    b, k, max_len, plain_steps = args.batch, args.tokens, args.max_len, 16
    length = bucket(args.position + max(k, plain_steps) + 1, max_len)
    caches = {name: init_cache(cfg, b, max_len) for name in ("plain", "verify", "draft")}
    inputs = slot_inputs(b, args.position, 10**6)  # tokens, positions, seeds, ..., remaining, stop_ids
    drafts = np.random.default_rng(0).integers(0, cfg.vocab_size, (b, k)).astype(np.int32)
    n_draft = np.full(b, k, np.int32)

    def call(name: str) -> float:
        start = time.perf_counter()
        if name == "plain":
            caches[name], tokens, _, count, _ = decode(cfg, length, plain_steps, weights, caches[name],
                                                       *inputs[:8], inputs[8] * 0 + plain_steps, inputs[9])
        else:
            layers = args.draft_layers if name == "draft" else 0
            caches[name], tokens, _, count, _ = speculate(cfg, length, k, layers, weights, caches[name], inputs[0],
                                                          inputs[1], drafts, n_draft, *inputs[2:])
        np.asarray(tokens), np.asarray(count)
        return time.perf_counter() - start

    times: dict[str, list[float]] = {name: [] for name in caches}
    for name in caches:
        call(name)  # compile
    for _ in range(args.repeats):
        for name in caches:
            times[name].append(call(name))
    med = {name: 1e3 * statistics.median(t) for name, t in times.items()}
    plain_ms = med["plain"] / plain_steps
    rates = (0.5, 0.7, 0.9)
    per_verify = {a: (1 - a ** (k + 1)) / (1 - a) for a in rates}
    print(f"shape={args.shape} batch={b} position={args.position} k={k} draft=layers:{args.draft_layers} "
          f"repeats={args.repeats}")
    print(f"plain decoding: {plain_ms:.3f} ms/token ({plain_steps} steps a call)")
    print(f"{'call':<14} {'ms/call':>8} " + " ".join(f"{'ms/tok a=' + str(a):>12}" for a in rates)
          + " " + " ".join(f"{'x a=' + str(a):>7}" for a in rates))
    rows = []
    for name in ("verify", "draft"):
        per_token = {a: med[name] / per_verify[a] for a in rates}
        print(f"{name:<14} {med[name]:>8.3f} " + " ".join(f"{per_token[a]:>12.3f}" for a in rates)
              + " " + " ".join(f"{plain_ms / per_token[a]:>6.2f}x" for a in rates))
        rows.append({"call": name, "ms_per_call": round(med[name], 4),
                     "ms_per_token": {str(a): round(per_token[a], 4) for a in rates}})
    print(json.dumps({"bench": "speculation_steps", "shape": args.shape, "batch": b, "k": k,
                      "plain_ms_per_token": round(plain_ms, 4), "rows": rows}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--checkpoint", type=Path, default=None, help="a run dir: load RUN_DIR/hf")
    parser.add_argument("--task", default="repeat_letter")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--tokens", type=int, default=4)
    parser.add_argument("--ngram", type=int, default=2)
    parser.add_argument("--draft-layers", type=int, default=1)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--ignore-stop", action="store_true", help="decode max-new-tokens whatever is sampled")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--shape", default=None, help="step-cost mode on random weights (bench_decode.py's shapes)")
    parser.add_argument("--batch", type=int, default=1, help="--shape mode: slots decoding")
    parser.add_argument("--position", type=int, default=256, help="--shape mode: the slots' position")
    parser.add_argument("--max-len", type=int, default=2048, help="--shape mode: KV positions per slot")
    args = parser.parse_args()
    if args.shape:
        return step_costs(args)

    source = str(args.checkpoint / "hf") if args.checkpoint else args.model
    loaded = load_model(source)
    task = build_task({"name": args.task})
    encode = task.encoder(loaded.tokenizer, loaded.chat_template)
    prompts = [encode(e).prompt_ids for e in task.split_examples("train")[:max(args.batches)]]
    configs = configurations(args)
    runs: dict[tuple[int, str], list[dict]] = {}
    for batch in args.batches:
        for spec in configs.values():
            decode(loaded, prompts[:batch], spec, args)  # compile
    for _ in range(args.repeats):
        for batch in args.batches:
            for name, spec in configs.items():
                runs.setdefault((batch, name), []).append(decode(loaded, prompts[:batch], spec, args))

    rows = []
    for (batch, name), rs in runs.items():
        tps = statistics.median(r["tokens"] / r["seconds"] for r in rs)
        drafted, accepted = sum(r["drafted"] for r in rs), sum(r["accepted"] for r in rs)
        base = statistics.median(r["tokens"] / r["seconds"] for r in runs[(batch, "plain")])
        rows.append({"batch": batch, "engine": name, "tokens_per_s": round(tps, 1), "speedup": round(tps / base, 2),
                     "acceptance": round(accepted / drafted, 3) if drafted else None,
                     "tokens_per_call": round(statistics.median(r["tokens"] / r["calls"] for r in rs), 2)})
    print(f"model={source} task={args.task} temperature={args.temperature} max_new_tokens={args.max_new_tokens} "
          f"repeats={args.repeats}")
    print(f"{'batch':>5}  {'engine':<16} {'tokens/s':>9} {'vs plain':>8} {'acceptance':>10} {'tokens/call':>11}")
    for r in rows:
        acc = "-" if r["acceptance"] is None else f"{r['acceptance']:.3f}"
        print(f"{r['batch']:>5}  {r['engine']:<16} {r['tokens_per_s']:>9.1f} {r['speedup']:>7.2f}x {acc:>10} "
              f"{r['tokens_per_call']:>11.2f}")
    print(json.dumps({"bench": "speculation", "model": source, "task": args.task,
                      "temperature": args.temperature, "rows": rows}))


if __name__ == "__main__":
    main()
