"""The bare model against an earlier revision of itself, side by side in one process.

The model's modules (`jaxrl_async/models/` transformer.py and the rope.py and attention.py it
imports) at `--baseline` (a git revision) are imported as a second copy, both models get the
same parameters, and the runs alternate so that both see the same machine load (CPU timings on
a shared machine drift by 2x within a minute; only medians of interleaved runs compare). Measured, per model:
jitted gradient of the summed next-token log-probs (what the train step differentiates) at
`--rows` x `--seq` on a small random model (the shape of `bench_train_step.py`), and its forward
alone. (Generation is measured end to end by `bench_engine.py`.) Prints medians, the ratio baseline / current, and the largest output difference between the two.

Not a test: `python benchmarks/bench_model.py [--baseline HEAD --rows 16 --seq 256 ...]`.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxrl_async.models import transformer as current
from jaxrl_async.models.config import ModelConfig
from train_shape import add_train_shape_args, train_shape_config  # benchmarks/, beside this script

# The model's modules under jaxrl_async/models/, each after those it imports. Revisions before
# rope.py and attention.py were split out of transformer.py hold transformer.py alone.
MODEL_MODULES = ("rope", "attention", "transformer")


def import_revision(rev: str, tmp: str):
    """The model (its transformer module) as it was at git revision `rev`.

    Each of MODEL_MODULES that `rev` has is imported as `baseline_<name>`, its imports of the
    others rewritten to their baseline copies, so the baseline runs its own RoPE and attention,
    not the working tree's."""
    root = Path(__file__).resolve().parents[1]
    module, loaded = None, []
    for name in MODEL_MODULES:
        shown = subprocess.run(["git", "show", f"{rev}:jaxrl_async/models/{name}.py"], cwd=root,
                               check=name == "transformer", capture_output=True, text=True)
        if shown.returncode != 0:
            continue  # not split out of transformer.py yet at `rev`
        source = shown.stdout
        for dep in loaded:
            source = source.replace(f"from jaxrl_async.models.{dep} import", f"from baseline_{dep} import")
        path = Path(tmp) / f"baseline_{name}.py"
        path.write_text(source)
        spec = importlib.util.spec_from_file_location(f"baseline_{name}", path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
        loaded.append(name)
    return module


def twin_models(modules: dict, cfg: ModelConfig) -> dict[str, nnx.Module]:
    """One model per module, all holding the parameters of the first."""
    models = {name: m.Transformer(cfg, rngs=nnx.Rngs(0)) for name, m in modules.items()}
    params = nnx.state(next(iter(models.values())), nnx.Param)
    for model in models.values():
        nnx.update(model, params)
    return models


def interleaved_medians(fns: dict, repeats: int) -> dict[str, float]:
    times = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            start = time.perf_counter()
            jax.block_until_ready(fn())
            times[name].append(time.perf_counter() - start)
    return {name: float(np.median(t)) for name, t in times.items()}


def train_case(modules: dict, args) -> dict:
    cfg = train_shape_config(args)
    tokens = jax.random.randint(jax.random.key(1), (args.rows, args.seq), 0, args.vocab)
    positions = jnp.broadcast_to(jnp.arange(args.seq, dtype=jnp.int32), tokens.shape)
    fns, outputs = {}, {}
    for name, model in twin_models(modules, cfg).items():
        graphdef, params = nnx.split(model)

        def logprob_sum(params, graphdef=graphdef):
            logits = nnx.merge(graphdef, params)(tokens, positions)
            if isinstance(logits, tuple):  # revisions before the cache moved out returned (logits, cache)
                logits = logits[0]
            logp = jax.nn.log_softmax(logits[:, :-1], axis=-1)
            return jnp.take_along_axis(logp, tokens[:, 1:, None], axis=-1).sum()

        fwd, grad = jax.jit(logprob_sum), jax.jit(jax.grad(logprob_sum))
        start = time.perf_counter()
        outputs[name] = jax.block_until_ready(grad(params))
        compile_s = time.perf_counter() - start
        fns[f"{name} fwd"] = lambda fwd=fwd, params=params: fwd(params)
        fns[f"{name} fwd+bwd"] = lambda grad=grad, params=params: grad(params)
        print(f"train {name}: first fwd+bwd call (compile + run) {compile_s:.1f}s", flush=True)
    diff = max(float(jnp.max(jnp.abs(a - b))) for a, b in
               zip(*(jax.tree.leaves(o) for o in outputs.values())))
    return {"medians_s": interleaved_medians(fns, args.repeats), "max_grad_diff": diff}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--baseline", default="HEAD", help="git revision of the model file to compare to")
    add_train_shape_args(ap)
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args()
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        modules = {"baseline": import_revision(args.baseline, tmp), "current": current}
        results["train"] = train_case(modules, args)
    for case, r in results.items():
        m = r["medians_s"]
        for part in sorted({k.split(" ", 1)[1] if " " in k else "" for k in m}):
            suffix = f" {part}" if part else ""
            base, cur = m[f"baseline{suffix}"], m[f"current{suffix}"]
            print(f"{case + suffix:>18}: baseline {base * 1e3:8.1f} ms   current {cur * 1e3:8.1f} ms   "
                  f"speedup {base / cur:5.2f}x")
    print(json.dumps({"baseline": args.baseline, "device": str(jax.devices()[0]), **results}))


if __name__ == "__main__":
    main()
