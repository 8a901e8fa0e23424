"""`Trainer`: owns the model's graphdef, float32 master params, optimizer state and version.

It is the stateful shell around the pure `train_step`: it places params (with the model's
logical-axis shardings when given a mesh) and batches (rows split over the mesh axes of the
logical `batch` axis: data and fsdp), checks batch shapes before a compile could fail
obscurely, and counts applied updates.

`version` counts *applied* updates only: a step skipped for a non-finite loss or gradient
leaves the weights, the optimizer state (its step count, hence the learning-rate schedule) and
the version unchanged, so version v always names the weights after v updates (docs/design.md §1).

With `cfg.lora.rank > 0` (LoRA) the trained params are an adapter (models/lora.py): the model's
params are kept as the frozen float32 base beside it — never donated, differentiated or decayed
— and the optimizer state, checkpoints and weight pushes hold the adapter only.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx, serialization
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from jaxrl_async import host_memory
from jaxrl_async.models.lora import TARGETS, LoraAdapter, init_adapter, rank_limit
from jaxrl_async.models.transformer import EMBED, LAYERS
from jaxrl_async.sharding import RULES, batch_sharding, logical_sharding, param_shardings
from jaxrl_async.trainer.batch import TrainBatch
from jaxrl_async.trainer.config import TrainerConfig
from jaxrl_async.trainer.optim import make_optimizer, make_schedule
from jaxrl_async.trainer.step import Params, compute_logprobs, model_inputs, train_step
from jaxrl_async.trees import cast_floats, check_like, leaves_by_path, path_str


def _decay_paths(state: nnx.State) -> frozenset[str]:
    """Weight decay on weight matrices only: leaves with an `embed` axis and one more axis
    besides `layers` (norm scales and biases have none or one). Leaves without logical-axis
    metadata fall back to ndim >= 2."""
    def is_matrix(var: nnx.Variable) -> bool:
        axes = var.get_metadata().get("logical_axes")
        if axes is None:
            return var.value.ndim >= 2
        named = [a for a in axes if a is not None and a != LAYERS]
        return EMBED in named and len(named) >= 2
    flags = jax.tree.map(is_matrix, state, is_leaf=lambda x: isinstance(x, nnx.Variable))
    flat = jax.tree_util.tree_flatten_with_path(nnx.State(flags).to_pure_dict())[0]
    return frozenset(jax.tree_util.keystr(path) for path, decay in flat if decay)


def _optimizer_shardings(opt_shapes: Any, params: Params, param_sh: Params,
                         replicated: NamedSharding) -> Any:
    """Shardings for the optimizer state: a leaf whose path ends with a param's path and that
    has its shape (Adam's moments) is sharded like that param; the rest (step counts) replicated."""
    params_by_path = {
        jax.tree_util.keystr(path): (leaf.shape, sh)
        for (path, leaf), sh in zip(jax.tree_util.tree_flatten_with_path(params)[0], jax.tree.leaves(param_sh))}

    def one(path, leaf):
        for start in range(len(path)):
            shape, sh = params_by_path.get(jax.tree_util.keystr(path[start:]), (None, None))
            if shape == leaf.shape:
                return sh
        return replicated

    return jax.tree_util.tree_map_with_path(one, opt_shapes)


def lora_layer_shapes(state: nnx.State) -> dict[str, tuple[int, ...]]:
    """{param: stacked shape} of the model's layer weights (what models/lora.py sizes adapters by)."""
    return {name: tuple(value.shape) for name, value in nnx.to_pure_dict(state)["layers"].items()}


def check_lora_rank(cfg: TrainerConfig, layer_shapes: dict[str, tuple[int, ...]]) -> None:
    """`trainer.lora.rank` no larger than every target's smallest dimension (a one-line ValueError)."""
    target, limit = rank_limit(layer_shapes, cfg.lora.targets)
    if cfg.lora.rank > limit:
        raise ValueError(f"trainer.lora.rank={cfg.lora.rank}: larger than {target}'s smaller dimension ({limit}); "
                         f"use a rank <= {limit}")


def _adapter_shardings(state: nnx.State, adapter: Params, mesh: Mesh) -> Params:
    """A is sharded like its weight's input axes, B like its output axes; the rank axis is not."""
    layers = state["layers"]
    out = {}
    for name, in_axes in TARGETS.values():
        if name not in adapter["layers"]:
            continue
        axes = layers[name].get_metadata()["logical_axes"]
        ab = adapter["layers"][name]
        out[name] = {"a": logical_sharding((*axes[:1 + in_axes], None), ab["a"].shape, mesh),
                     "b": logical_sharding((axes[0], None, *axes[1 + in_axes:]), ab["b"].shape, mesh)}
    return {"layers": out}


class Trainer:
    """`step(batch) -> metrics`, `params()` to publish, `version`, `state_dict()` to save."""

    def __init__(self, model: nnx.Module, cfg: TrainerConfig, *, mesh: Mesh | None = None):
        """`model` must hold only `nnx.Param` state (its float params are kept as float32)."""
        self.cfg = cfg
        self.mesh = mesh
        graphdef, state = nnx.split(model, nnx.Param)
        self._graphdef = graphdef
        params = cast_floats(state.to_pure_dict(), jnp.float32)
        self._frozen: Params | None = None  # LoRA: the base params, frozen
        if cfg.lora.enabled:
            check_lora_rank(cfg, lora_layer_shapes(state))
            base = params
            params = init_adapter(lora_layer_shapes(state), cfg.lora.rank, cfg.lora.targets, jax.random.key(0))
            # Every adapter matrix decays, as PEFT's under a plain AdamW.
            self._decay_paths = frozenset(jax.tree_util.keystr(p) for p, _ in
                                          jax.tree_util.tree_flatten_with_path(params)[0])
        else:
            self._decay_paths = _decay_paths(state)
        init = make_optimizer(cfg.optim, self._decay_paths).init
        static = ("graphdef", "cfg", "decay_paths")
        donate = ("params", "opt_state")
        if mesh is None:
            # Committed to one device, as the step's outputs will be: jit keys its cache on
            # placement, so committed and uncommitted inputs would compile the step twice.
            params = jax.device_put(params, jax.devices()[0])
            if cfg.lora.enabled:
                self._frozen = jax.device_put(base, jax.devices()[0])
            opt_state = jax.device_put(jax.jit(init)(params), jax.devices()[0])
            self._train_step = jax.jit(train_step, static_argnames=static, donate_argnames=donate)
            self._row_sharding, self._row_shards = None, 1
        else:
            param_sh = nnx.State(param_shardings(state, mesh)).to_pure_dict()
            if cfg.lora.enabled:
                self._frozen = jax.device_put(base, param_sh)
                param_sh = _adapter_shardings(state, params, mesh)
            opt_sh = _optimizer_shardings(jax.eval_shape(init, params), params, param_sh,
                                          NamedSharding(mesh, PartitionSpec()))
            params = jax.device_put(params, param_sh)
            opt_state = jax.jit(init, out_shardings=opt_sh)(params)
            # Fixed output shardings keep every step's outputs placed like its inputs (else
            # XLA may choose others and the next call recompiles).
            self._train_step = jax.jit(train_step, static_argnames=static, donate_argnames=donate,
                                       out_shardings=(param_sh, opt_sh, None))
            # Rows split over the mesh axes of the logical `batch` axis (data and fsdp); a
            # [N] spec shards the leading axis of the [N, T] arrays too.
            self._row_sharding = batch_sharding(mesh, ndim=1)
            row_axes = RULES["batch"]
            row_axes = (row_axes,) if isinstance(row_axes, str) else tuple(row_axes or ())
            self._row_shards = int(np.prod([mesh.shape[a] for a in row_axes]))
        self._params, self._opt_state = params, opt_state
        # On CPU the arrays are host memory: a background checkpoint save reads them in place.
        self._host_memory = all(d.platform == "cpu" for d in jax.tree.leaves(params)[0].devices())
        self._lent: list[Callable[[], None]] = []  # `lend`'s releases, called before the next step
        self._version = 0
        self._schedule = make_schedule(cfg.optim)

    @property
    def version(self) -> int:
        """Number of applied optimizer updates; the published weights are version `version`."""
        return self._version

    @property
    def graphdef(self) -> nnx.GraphDef:
        return self._graphdef

    @property
    def lora(self) -> bool:
        """Whether the trained params are a LoRA adapter on a frozen base."""
        return self._frozen is not None

    def params(self, dtype: str | None = None, copy: bool = True) -> Params:
        """The current trained params as a nested dict, float32 or cast to `dtype` (e.g. an
        engine's "bfloat16"): the model's (`nnx.merge(trainer.graphdef, p)` rebuilds it) or, with
        LoRA, the adapter's ({"layers": {param: {"a", "b"}}}). The step donates its params, so
        `copy=False` (and no cast) returns arrays that die at the next `step`."""
        if dtype is not None and jnp.dtype(dtype) != jnp.float32:
            return cast_floats(self._params, dtype)
        return jax.tree.map(jnp.copy, self._params) if copy else self._params

    @property
    def rows_multiple(self) -> int:
        """A batch's row count must be a multiple of this: micro-batches × batch shards."""
        return self.cfg.num_microbatches * self._row_shards

    def engine_params(self, dtype: str) -> Params:
        """The params to push to the generation engines, cast to their `dtype`.

        On one process these are device arrays in the trainer's layout: the engine reshards them
        onto its own devices on device (`engines.jax.weights.accept_params`), with no host copy. When
        the mesh spans processes, an engine on process 0 cannot address the other processes'
        shards, so the full params are gathered to host memory on every process (a collective:
        every process calls this at the same point; jaxrl_async/cluster/lockstep.py).
        With LoRA: the adapter alone, as a `LoraAdapter` (the engine merges it into its base).
        """
        params = self.params(dtype, copy=False)
        if self.lora:
            params = LoraAdapter(params, self.cfg.lora.scale)
        if self.mesh is None or not self.mesh.is_multi_process:
            return params
        from jax.experimental import multihost_utils

        return multihost_utils.process_allgather(params, tiled=True)

    def host_params(self) -> Params:
        """The float32 trained params as host numpy arrays (export, tests), a `LoraAdapter` with
        LoRA; a collective when the mesh spans processes, like `engine_params`, whose gather it
        reuses."""
        return jax.device_get(self.engine_params("float32"))

    def _place(self, batch: TrainBatch) -> TrainBatch:
        k = self.cfg.num_microbatches
        rows, multiple = batch.num_rows, self.rows_multiple
        if rows % multiple:
            raise ValueError(
                f"TrainBatch rows={rows}: must be a multiple of num_microbatches ({k}) x batch "
                f"shards ({self._row_shards}) = {multiple}; use pad_batch(..., rows_multiple={multiple})")
        if self.cfg.loss.kl_coef > 0 and batch.ref_logprobs is None:
            raise ValueError(f"TrainBatch.ref_logprobs is None but loss.kl_coef={self.cfg.loss.kl_coef} > 0")
        if self._row_sharding is None:
            return jax.device_put(batch)
        return jax.device_put(batch, self._row_sharding)

    def lend(self, release: Callable[[], None]) -> None:
        """`state_dict()`'s arrays are being read in the background (an asynchronous checkpoint
        save); `release()` returns once that reader is done. Where the arrays are host memory
        (CPU) the reader holds the buffers themselves, and a step cannot donate a buffer that
        someone else holds: it would allocate a second copy of the params and optimizer state for
        its outputs (2.8 GiB more at SmolLM2-135M, docs/memory.md). So the next `step` calls
        `release()` first. Elsewhere the save has copied the arrays to host memory before it
        returned, and the step does not wait."""
        if self._host_memory:
            self._lent.append(release)

    def step(self, batch: TrainBatch) -> dict[str, float]:
        """One optimizer update; returns the step's metrics as floats (see `train_step`)."""
        while self._lent:  # the buffers this step donates are read no more (`lend`)
            self._lent.pop(0)()
        host_memory.trim()  # what the save's encoding and the engine's steps freed (docs/memory.md)
        lr = float(self._schedule(self._version))
        self._params, self._opt_state, metrics = self._train_step(
            self._graphdef, self._params, self._opt_state, self._place(batch),
            cfg=self.cfg, decay_paths=self._decay_paths, frozen=self._frozen)
        metrics = {k: float(v) for k, v in jax.device_get(metrics).items()}
        if not metrics["skipped"]:
            self._version += 1
        metrics.update(lr=lr, version=float(self._version))
        return metrics

    def logprobs(self, tokens: jax.Array) -> jax.Array:
        """[B, T] per-token log-probs of `tokens` under the current params (as in the loss)."""
        params, adapter = model_inputs(self._params, self._frozen, self.cfg)
        return compute_logprobs(self._graphdef, params, jnp.asarray(tokens), self.cfg.compute_dtype,
                                self.cfg.logits_chunk, adapter)

    # ------------------------------------------------------------------ checkpoints

    def state_dict(self) -> dict[str, Any]:
        """Nested dicts of arrays plus `version` (an int): what orbax saves as a pytree. With LoRA
        `params` is the adapter: the base is the model source the run's meta names."""
        return {"params": self._params,
                "opt_state": serialization.to_state_dict(self._opt_state),
                "version": self._version}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore from `state_dict()` output (or orbax's restore of it), after checking that
        every leaf has the current tree's structure, shape and dtype; keeps the placements."""
        what = "the state given to load_state_dict"
        check_like({"params": self._params}, {"params": state["params"]}, what)
        opt_state = serialization.from_state_dict(self._opt_state, state["opt_state"])
        check_like({"opt_state": self._opt_state}, {"opt_state": opt_state}, what)
        self._params = _placed_like(self._params, state["params"])
        self._opt_state = _placed_like(self._opt_state, opt_state)
        self._version = int(state["version"])


def _placed_like(current: Any, loaded: Any) -> Any:
    """`loaded` (already `check_like`d against `current`) in `current`'s structure and placements."""
    new = leaves_by_path(loaded)
    return jax.tree_util.tree_map_with_path(lambda p, cur: jax.device_put(new[path_str(p)], cur.sharding), current)
