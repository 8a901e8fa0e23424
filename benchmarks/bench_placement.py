"""What each engine placement costs per weight push, next to the train step and decode it buys.

Builds, in one run, every placement that fits the visible devices and measures them side by
side (medians of `--repeats`; of `--repeats` x `--pushes` for the push, which is short and noisy):

- `colocated`: one engine replica on the trainer's device(s) (`engine.colocate=true`); a push is
  `trainer.engine_params(dtype)` then `engine.update_weights`: cast, reshard and install on
  device, as `runtime/controller.py` `_push` does;
- `separate` (>= 2 devices): the engine on devices the trainer does not use
  (`engine.colocate=false`); the push copies device to device;
- `host`: the colocated engine again, but the push goes through host memory
  (`jax.device_get`, then host -> device): what an engine in another process pays at least;
- `own-process`: an engine in its own OS process on the trainer's first device (both processes
  share it, `XLA_PYTHON_CLIENT_MEM_FRACTION`); a push is `device_get`, a copy of the bytes into a
  memory-mapped file the two processes share (/dev/shm when it has room), then `device_put` and
  install in the other process, until it acknowledges.

Every push ends when the engine's installed weights are ready (`block_until_ready`), so the time
includes the on-device install, not just its dispatch. For each placement also: one train step
of `--rows` x `--seq` tokens, the engine's decode tokens/s for `--slots` greedy sequences of
`--new` tokens (prefill included), and `step || decode`: the wall time of one train step while
the engine decodes one such round: on shared devices the two take turns, on separate ones they
overlap. One trainer serves every placement; `host` also reuses the colocated engine, so its
step and decode columns measure the same objects again. On CPU "device" memory is host memory:
`device_get` copies nothing there, so `host` and `colocated` cost about the same, and the
forced CPU devices share the same cores, so `separate` overlaps nothing.

Shapes: `tiny` is bench_train_step.py's default model (4 layers, hidden 256, vocab 4096);
`qwen2.5-1.5b` is Qwen2.5-1.5B's shape (tied embeddings, q/k/v biases) with random weights.
Dtype `auto` is bfloat16 on an accelerator and float32 on CPU (XLA:CPU's bfloat16 dots are slow).

Not a test: `python benchmarks/bench_placement.py [--shape tiny] [--out placement.json]`; for the
separate placement on CPU run it with XLA_FLAGS=--xla_force_host_platform_device_count=4.
Prints a table and writes it as JSON with `--out`.

Left out: replicas > 1 and tensor parallel > 1 are accepted (`--replicas`, `--tensor-parallel`)
but the own-process engine is always one replica on one device; the own-process transfer uses
a file, not CUDA IPC handles (what a Ray worker on the same host would get without NCCL).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxrl_async.cluster.placement import plan_placement
from jaxrl_async.engines.base import GenerationEngine, GenerationRequest, SamplingParams
from jaxrl_async.engines.jax.config import EngineConfig
from jaxrl_async.engines.jax.engine import JaxEngine
from jaxrl_async.models.config import ModelConfig
from jaxrl_async.models.transformer import Transformer
from jaxrl_async.trainer.batch import TrainBatch, pad_batch
from jaxrl_async.trainer.config import MeshConfig, TrainerConfig
from jaxrl_async.trainer.optim import OptimConfig
from jaxrl_async.trainer.trainer import Trainer

PLACEMENTS = ("colocated", "separate", "host", "own-process")
SHAPES: dict[str, dict[str, Any]] = {
    "tiny": dict(vocab_size=4096, hidden_size=256, intermediate_size=1024, num_layers=4, num_heads=8,
                 num_kv_heads=4, head_dim=32, max_position_embeddings=4096),
    "qwen2.5-1.5b": dict(vocab_size=151936, hidden_size=1536, intermediate_size=8960, num_layers=28,
                         num_heads=12, num_kv_heads=2, head_dim=128, attention_bias=True,
                         tie_word_embeddings=True, rope_theta=1e6, max_position_embeddings=32768),
}


def model_config(shape: str, dtype: str) -> ModelConfig:
    # No stop token: every sequence decodes exactly --new tokens.
    return ModelConfig(**SHAPES[shape], dtype=dtype, bos_token_id=None, eos_token_ids=())


def make_batch(cfg: ModelConfig, rows: int, seq: int, rows_multiple: int) -> TrainBatch:
    """bench_train_step.py's batch: a quarter prompt, the rest completion, random advantages."""
    rng = np.random.default_rng(0)
    prompt = seq // 4
    samples = [(list(rng.integers(0, cfg.vocab_size, prompt)), list(rng.integers(0, cfg.vocab_size, seq - prompt)),
                list(-rng.uniform(5, 9, seq - prompt)), float(rng.random()), i // 4) for i in range(rows)]
    return pad_batch(samples, buckets=[seq], rows_multiple=rows_multiple)


def make_prompts(cfg: ModelConfig, slots: int, length: int) -> list[list[int]]:
    rng = np.random.default_rng(1)
    return [rng.integers(0, cfg.vocab_size, length).tolist() for _ in range(slots)]


def engine_config(args: argparse.Namespace) -> EngineConfig:
    max_len = 1 << (args.prompt_len + args.new - 1).bit_length()  # next power of two
    # One prefill bucket: each bucket is one more compilation of the unrolled layers (slow for 28
    # of them); packing several short prompts into one max_len row costs little.
    return EngineConfig(num_slots=args.slots, max_len=max_len, min_bucket=max_len)


def median(values: list[float]) -> float:
    return float(np.median(values))


# ------------------------------------------------------------------ engines in this process


def cores(engine: GenerationEngine) -> list:
    """The `EngineCore`s of a `JaxEngine` or of a `ReplicatedEngine`'s replicas."""
    return [replica.core for replica in getattr(engine, "replicas", [engine])]


def wait_installed(engine: GenerationEngine) -> None:
    """Until the installed weights exist: update_weights returns once the engine holds them, while
    the on-device copy into its layout may still run."""
    jax.block_until_ready([core.weights for core in cores(engine)])


async def decode_round(engine: GenerationEngine, prompts: list[list[int]], new: int, tag: str) -> float:
    """Seconds to generate `new` greedy tokens for every prompt (prefill included)."""
    start = time.perf_counter()
    for i, prompt in enumerate(prompts):
        await engine.submit(GenerationRequest(f"{tag}-{i}", prompt, SamplingParams(new, temperature=0.0)))
    done = 0
    async for out in engine.outputs():
        done += out.done
        if done == len(prompts):
            break
    return time.perf_counter() - start


def build_engine(model: nnx.Module, cfg: ModelConfig, ecfg: EngineConfig, meshes: tuple) -> GenerationEngine:
    """One JaxEngine per replica mesh (its own copy of the weights: the trainer donates its own);
    compiled before it starts (`warmup` is not thread-safe once the worker runs)."""
    graphdef, state = nnx.split(model)
    engines = [JaxEngine(nnx.merge(graphdef, jax.tree.map(jnp.copy, state)), cfg, ecfg, mesh=mesh)
               for mesh in meshes]
    for engine in engines:
        engine.core.warmup()
    if len(engines) == 1:
        return engines[0]
    from jaxrl_async.engines.replicated import ReplicatedEngine

    return ReplicatedEngine(engines)


class OnDevice:
    """An engine in this process, pushed to as the controller does: device arrays, resharded and
    installed by the engine."""

    def __init__(self, engine: GenerationEngine, prompts: list[list[int]], new: int):
        self.engine, self.prompts, self.new = engine, prompts, new

    async def push(self, trainer: Trainer, dtype: str, version: int) -> dict[str, float]:
        start = time.perf_counter()
        await self.engine.update_weights(trainer.engine_params(dtype), version)
        wait_installed(self.engine)
        return {"push_s": time.perf_counter() - start}

    async def decode(self, tag: str) -> float:
        return await decode_round(self.engine, self.prompts, self.new, tag)

    async def close(self) -> None:
        await self.engine.stop()


class ThroughHost(OnDevice):
    """The same engine, pushed to through host memory."""

    async def push(self, trainer: Trainer, dtype: str, version: int) -> dict[str, float]:
        start = time.perf_counter()
        host = jax.device_get(trainer.engine_params(dtype))
        got = time.perf_counter()
        await self.engine.update_weights(host, version)
        wait_installed(self.engine)
        end = time.perf_counter()
        return {"push_s": end - start, "device_get_s": got - start, "device_put_install_s": end - got}

    async def close(self) -> None:  # the colocated placement stops the engine
        pass


# ------------------------------------------------------------------ an engine in its own process


def _child_main(conn, cfg: ModelConfig, ecfg: EngineConfig, prompts: list[list[int]], new: int,
                spawned: float) -> None:
    """The other process: build and compile an engine on its first device, then serve commands
    (("weights", path, layout), ("push", version), ("decode", tag), ("stop",)) until "stop"."""
    engine = build_engine(Transformer(cfg, rngs=nnx.Rngs(0)), cfg, ecfg, (None,))
    conn.send(("ready", time.time() - spawned))  # from spawn: interpreter, imports, init, compile

    async def serve() -> None:
        await engine.start()
        params = None
        while True:
            command = await asyncio.to_thread(conn.recv)
            if command[0] == "weights":  # the shared file: read-only views, no copy
                _, path, layout = command
                mapped = np.memmap(path, np.uint8, mode="r")
                params = {}
                for keys, shape, dtype, offset in layout:
                    leaf = np.ndarray(shape, jnp.dtype(dtype), buffer=mapped, offset=offset)
                    node = params
                    for key in keys[:-1]:
                        node = node.setdefault(key, {})
                    node[keys[-1]] = leaf
                conn.send(("ok",))
            elif command[0] == "push":
                t = time.perf_counter()
                await engine.update_weights(params, command[1])
                wait_installed(engine)
                conn.send(("ok", time.perf_counter() - t))
            elif command[0] == "decode":
                conn.send(("ok", await decode_round(engine, prompts, new, command[1])))
            else:
                await engine.stop()
                conn.send(("ok",))
                return

    asyncio.run(serve())


class OwnProcess:
    """An engine in a spawned process; weights travel through a shared memory-mapped file."""

    def __init__(self, cfg: ModelConfig, ecfg: EngineConfig, prompts: list[list[int]], new: int,
                 mem_fraction: str, timeout_s: float):
        self.timeout_s = timeout_s
        ctx = multiprocessing.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_child_main, args=(child, cfg, ecfg, prompts, new, time.time()),
                                daemon=True)
        # This process's backend is initialized already: the variable only reaches the child.
        before = os.environ.get("XLA_PYTHON_CLIENT_MEM_FRACTION")
        os.environ["XLA_PYTHON_CLIENT_MEM_FRACTION"] = mem_fraction
        self.proc.start()
        if before is None:
            del os.environ["XLA_PYTHON_CLIENT_MEM_FRACTION"]
        else:
            os.environ["XLA_PYTHON_CLIENT_MEM_FRACTION"] = before
        self.setup_s: float | None = None
        self.views: list[np.ndarray] = []
        self.path: str | None = None

    async def _ask(self, *command) -> tuple:
        """Send `command` (none: wait for "ready") and return the child's answer; a dead child is
        a ChildProcessError at once, a silent one a TimeoutError after --child-timeout-s."""
        if command:
            self.conn.send(command)
        deadline = time.perf_counter() + self.timeout_s
        while not await asyncio.to_thread(self.conn.poll, 1.0):
            if not self.proc.is_alive():
                raise ChildProcessError(f"own-process engine exited with code {self.proc.exitcode} "
                                        f"before answering {command[:1] or 'start'} (its stderr is above)")
            if time.perf_counter() > deadline:
                raise TimeoutError(f"own-process engine: no answer to {command[:1] or 'start'} in "
                                   f"{self.timeout_s}s; raise --child-timeout-s")
        return self.conn.recv()

    async def ready(self) -> None:
        _, self.setup_s = await self._ask()

    async def share(self, params: Any) -> str:
        """Lay the params out in one file both processes map; the child keeps views of it."""
        flat = jax.tree_util.tree_flatten_with_path(params)[0]
        layout, offset = [], 0
        for path, leaf in flat:
            offset = -(-offset // 64) * 64  # aligned rows for the device copies
            layout.append((tuple(k.key for k in path), tuple(leaf.shape), str(leaf.dtype), offset))
            offset += leaf.size * leaf.dtype.itemsize
        where = "/dev/shm" if os.path.isdir("/dev/shm") and _free_bytes("/dev/shm") > 2 * offset \
            else tempfile.gettempdir()
        fd, self.path = tempfile.mkstemp(prefix="bench_placement_", dir=where)
        os.close(fd)
        mapped = np.memmap(self.path, np.uint8, mode="w+", shape=(offset,))
        self.views = [np.ndarray(shape, jnp.dtype(dtype), buffer=mapped, offset=off)
                      for _, shape, dtype, off in layout]
        await self._ask("weights", self.path, layout)
        return where

    async def push(self, trainer: Trainer, dtype: str, version: int) -> dict[str, float]:
        start = time.perf_counter()
        host = jax.device_get(trainer.engine_params(dtype))
        got = time.perf_counter()
        for view, leaf in zip(self.views, jax.tree.leaves(host)):
            np.copyto(view, leaf)
        copied = time.perf_counter()
        _, install_s = await self._ask("push", version)
        end = time.perf_counter()
        return {"push_s": end - start, "device_get_s": got - start, "copy_to_file_s": copied - got,
                "device_put_install_s": install_s, "signal_s": end - copied - install_s}

    async def decode(self, tag: str) -> float:
        return (await self._ask("decode", tag))[1]

    async def close(self) -> None:
        if self.proc.is_alive():
            await self._ask("stop")
            self.proc.join(self.timeout_s)
        self.views = []
        if self.path is not None:
            os.unlink(self.path)


def _free_bytes(path: str) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


# ------------------------------------------------------------------ measuring


@dataclass
class Row:
    placement: str
    trainer_devices: str  # device ids
    engine_devices: str
    setup_s: float  # engine build + compile (own-process: its own, in parallel with ours)
    push: dict[str, float] = field(default_factory=dict)  # medians, seconds
    first_push_s: float = 0.0  # includes compiling the install for the pushed layout
    step_s: float = 0.0
    decode_s: float = 0.0
    decode_tok_s: float = 0.0
    step_with_decode_s: float = 0.0
    note: str = ""


async def measure(row: Row, handle, trainer: Trainer, batch: TrainBatch, args, versions) -> Row:
    pushes, steps, decodes, overlapped = [], [], [], []
    row.first_push_s = (await handle.push(trainer, args.dtype, next(versions)))["push_s"]
    await handle.decode(f"{row.placement}-warm")
    for r in range(args.repeats):
        t = time.perf_counter()
        trainer.step(batch)  # returns fetched metrics: the step has finished
        steps.append(time.perf_counter() - t)
        for _ in range(args.pushes):  # pushes are short and noisy: more samples for their median
            pushes.append(await handle.push(trainer, args.dtype, next(versions)))
        decodes.append(await handle.decode(f"{row.placement}-{r}"))
        t = time.perf_counter()
        decoding = asyncio.ensure_future(handle.decode(f"{row.placement}-both-{r}"))
        await asyncio.to_thread(trainer.step, batch)
        await decoding
        overlapped.append(time.perf_counter() - t)
    row.push = {k: median([p[k] for p in pushes]) for k in pushes[0]}
    row.step_s, row.decode_s = median(steps), median(decodes)
    row.decode_tok_s = args.slots * args.new / row.decode_s
    row.step_with_decode_s = median(overlapped)
    return row


def describe(devices) -> str:
    ids = [d.id for d in devices]
    return f"{ids[0]}" if len(ids) == 1 else f"{ids[0]}-{ids[-1]}" if ids == list(range(ids[0], ids[-1] + 1)) \
        else ",".join(map(str, ids))


def print_table(result: dict) -> None:
    print(f"\n{result['shape']} ({result['params'] / 1e6:.1f}M params, push {result['push_bytes'] / 2**20:.1f} MiB "
          f"{result['dtype']}) on {result['devices']} x {result['device_kind']}; train step {result['rows']}x"
          f"{result['seq']} tokens, decode {result['slots']} x {result['new']} tokens; medians of "
          f"{result['repeats']} ({result['repeats'] * result['pushes']} pushes)")
    head = (f"{'placement':<12} {'trainer>engine':<15} {'push ms':>9} {'GB/s':>7} {'1st push':>9} {'step ms':>9} "
            f"{'decode tok/s':>12} {'step||decode ms':>15} {'setup s':>8}  push breakdown (ms)")
    print(head)
    print("-" * len(head))
    for row in result["placements"]:
        push = row["push"]["push_s"]
        parts = " + ".join(f"{k.removesuffix('_s')} {1e3 * v:.1f}" for k, v in row["push"].items() if k != "push_s")
        print(f"{row['placement']:<12} {row['trainer_devices'] + '>' + row['engine_devices']:<15} "
              f"{1e3 * push:>9.1f} {result['push_bytes'] / push / 1e9:>7.2f} {1e3 * row['first_push_s']:>9.1f} "
              f"{1e3 * row['step_s']:>9.1f} "
              f"{row['decode_tok_s']:>12.0f} {1e3 * row['step_with_decode_s']:>15.1f} {row['setup_s']:>8.1f}  "
              f"{parts}{'  (' + row['note'] + ')' if row['note'] else ''}")
    for name, why in result["skipped"].items():
        print(f"{name:<12} skipped: {why}")


async def run(args: argparse.Namespace, report) -> dict:
    """Measure every wanted placement; `report(result)` after each one (a partial table survives
    a stage timeout)."""
    cfg = model_config(args.shape, args.dtype)
    ecfg = engine_config(args)
    prompts = make_prompts(cfg, args.slots, args.prompt_len)
    trainer_mesh = MeshConfig(*args.trainer_mesh)
    wanted = [p for p in PLACEMENTS if p in args.placements]
    skipped: dict[str, str] = {}

    plans = {}
    for name in ("colocated", "separate"):
        if name in wanted or (name == "colocated" and "host" in wanted):
            try:
                plans[name] = plan_placement(trainer_mesh, replicas=args.replicas,
                                             tensor_parallel=args.tensor_parallel, colocate=name == "colocated")
            except ValueError as error:  # more devices than this machine has: say so in the table
                skipped[name] = str(error)
    if "host" in wanted and "colocated" not in plans:
        skipped["host"] = "needs the colocated placement's engine"

    model = Transformer(cfg, rngs=nnx.Rngs(0))
    n_params = sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
    handles, setup = {}, {}
    for name, plan in plans.items():  # engines first: the trainer donates the model's arrays
        start = time.perf_counter()
        engine = build_engine(model, cfg, ecfg, plan.engine_meshes)
        await engine.start()
        setup[name] = time.perf_counter() - start
        handles[name] = OnDevice(engine, prompts, args.new)
        print(f"engine for {name}: built and compiled in {setup[name]:.1f}s", flush=True)
    if "host" in wanted and "colocated" in handles:
        handles["host"] = ThroughHost(handles["colocated"].engine, prompts, args.new)
        setup["host"] = setup["colocated"]
    # Spawned after our engine compiled (a persistent compilation cache, when set, serves the
    # child the same programs) and before our train step compiles (that overlaps its start).
    child = None
    if "own-process" in wanted:
        child = OwnProcess(cfg, ecfg, prompts, args.new, args.child_mem_fraction, args.child_timeout_s)

    placement = next(iter(plans.values())) if plans else plan_placement(trainer_mesh)
    trainer = Trainer(model, TrainerConfig(optim=OptimConfig(lr=1e-5), compute_dtype=args.dtype),
                      mesh=placement.trainer_mesh)
    del model
    batch = make_batch(cfg, args.rows, args.seq, trainer.rows_multiple)
    start = time.perf_counter()
    trainer.step(batch)
    step_compile_s = time.perf_counter() - start
    print(f"trainer: first step (compile) {step_compile_s:.1f}s", flush=True)
    push_bytes = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(trainer.engine_params(args.dtype)))

    device = jax.devices()[0]
    result = {"shape": args.shape, "dtype": args.dtype, "params": int(n_params), "push_bytes": int(push_bytes),
              "devices": len(jax.devices()), "device_kind": device.device_kind, "backend": jax.default_backend(),
              "rows": args.rows, "seq": args.seq, "slots": args.slots, "new": args.new,
              "prompt_len": args.prompt_len, "repeats": args.repeats, "pushes": args.pushes,
              "trainer_mesh": list(args.trainer_mesh), "replicas": args.replicas,
              "tensor_parallel": args.tensor_parallel,
              "step_compile_s": step_compile_s, "placements": [], "skipped": skipped}
    versions = iter(range(1, 1 << 30))
    trainer_ids = describe(placement.trainer_devices)
    for name in wanted:
        if name == "own-process":
            try:
                await child.ready()
                print(f"own-process engine: ready {child.setup_s:.1f}s after its spawn", flush=True)
                via = await child.share(trainer.engine_params(args.dtype))
                row = Row(name, trainer_ids, f"{trainer_ids}(pid)", child.setup_s,
                          note=f"via {via}; setup from spawn, beside this process's work")
                result["placements"].append(vars(await measure(row, child, trainer, batch, args, versions)))
                print(f"measured {name}: push {1e3 * row.push['push_s']:.1f} ms", flush=True)
            except (ChildProcessError, TimeoutError) as error:  # the other placements still count
                skipped[name] = str(error)
        elif name in handles:
            plan = plans["colocated" if name == "host" else name]
            row = Row(name, trainer_ids, describe(plan.engine_devices), setup[name],
                      note="the colocated engine, pushed through host" if name == "host" else "")
            result["placements"].append(vars(await measure(row, handles[name], trainer, batch, args, versions)))
            print(f"measured {name}: push {1e3 * row.push['push_s']:.1f} ms", flush=True)
        report(result)
    for handle in list(handles.values()) + ([child] if child else []):
        await handle.close()
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", choices=sorted(SHAPES), default="tiny")
    ap.add_argument("--dtype", choices=["auto", "float32", "bfloat16"], default="auto")
    ap.add_argument("--placements", nargs="+", choices=PLACEMENTS, default=list(PLACEMENTS),
                    help="those that do not fit the visible devices are skipped")
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--slots", type=int, default=32)
    ap.add_argument("--new", type=int, default=32)
    ap.add_argument("--prompt-len", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--pushes", type=int, default=3, help="pushes per repeat (after each train step)")
    ap.add_argument("--trainer-mesh", type=int, nargs=3, default=[1, 1, 1], metavar=("DATA", "FSDP", "TENSOR"))
    ap.add_argument("--replicas", type=int, default=1)
    ap.add_argument("--tensor-parallel", type=int, default=1)
    ap.add_argument("--mem-fraction", default="0.55",
                    help="XLA_PYTHON_CLIENT_MEM_FRACTION of this process unless already set (GPU only)")
    ap.add_argument("--child-mem-fraction", default="0.3", help="the same for the own-process engine")
    ap.add_argument("--child-timeout-s", type=float, default=600.0)
    ap.add_argument("--out", help="also write the table as JSON here")
    args = ap.parse_args()
    if "own-process" in args.placements:
        # Before the first device call: the two processes share the first device.
        os.environ.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", args.mem_fraction)
    if args.dtype == "auto":
        args.dtype = "float32" if jax.default_backend() == "cpu" else "bfloat16"

    def report(result: dict) -> None:
        if args.out:
            with open(args.out, "w") as f:
                json.dump(result, f, indent=1)

    print_table(asyncio.run(run(args, report)))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
