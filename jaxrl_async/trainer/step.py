"""The jitted train step, as pure top-level functions over (graphdef, params, opt_state, batch).

One call = one optimizer update:
1. whole-batch terms (group advantages, aggregation weights) — before any split, since groups
   and normalizers span the batch; M2PO's trust region also needs the whole batch's log-probs,
   so with `off_policy=m2po` and several micro-batches a no-grad forward of each comes first;
2. the rows are split into `num_microbatches` micro-batches and `lax.scan` sums their gradients
   (the weights carry the batch normalization, so the sum is exactly the full-batch gradient);
3. if the loss or the gradient norm is not finite, the update is skipped: params and optimizer
   state are returned unchanged and `metrics["skipped"] = 1`;
4. otherwise AdamW (with clipping and schedule) updates the float32 params.

Micro-batch j takes rows j, j + k, j + 2k, ... (reshape [N] -> [N/k, k], then swap): with rows
sharded in contiguous blocks across data shards, every shard then holds an equal part of every
micro-batch and the split moves no data.

`params` and `opt_state` are donated where the step is jitted: the caller's previous arrays
are invalid after the call.

LoRA (`cfg.lora.rank > 0`): `params` is the adapter (models/lora.py) and the base model's params
come as `frozen`, an argument that is neither differentiated nor updated nor donated; gradients
and optimizer state exist for the adapter only. With `frozen=None` (full fine-tuning) every
function here traces exactly the graph it traced before adapters existed.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from jaxrl_async.models.lora import LoraAdapter
from jaxrl_async.models.transformer import project_logits
from jaxrl_async.trainer.batch import TrainBatch
from jaxrl_async.trainer.config import TrainerConfig
from jaxrl_async.trainer.losses import MAX_METRICS, batch_terms, m2po_trusted, policy_loss
from jaxrl_async.trainer.optim import make_optimizer
from jaxrl_async.trees import cast_floats

Params = Any  # nested dict of arrays (nnx.State.to_pure_dict()), what nnx.merge accepts


def _token_stats(logits: jax.Array, targets: jax.Array) -> tuple[jax.Array, jax.Array]:
    """logits [..., V], targets [...] int32 -> (log-prob of each target, entropy), both [...] f32."""
    logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)  # [..., V]
    token_logp = jnp.take_along_axis(logp, targets[..., None], axis=-1)[..., 0]
    entropy = -jnp.sum(jnp.exp(logp) * logp, axis=-1)
    return token_logp, entropy


def chunk_positions(rows: int, positions: int, logits_chunk: int) -> int:
    """Positions of every row that one chunk of `logits_chunk` tokens covers: a chunk spans all
    `rows` (so a row-sharded batch stays sharded chunk by chunk) and floor(logits_chunk / rows)
    positions, at least 1 and at most `positions`."""
    return min(positions, max(1, logits_chunk // rows))


def chunked_token_stats(hidden: jax.Array, head: jax.Array, targets: jax.Array,
                        logits_chunk: int) -> tuple[jax.Array, jax.Array]:
    """`_token_stats` of the logits `project_logits(hidden, head)`, without ever holding them.

    hidden [B, S, E] (final-normed), head [E, V], targets [B, S] -> (token log-probs, entropy)
    [B, S] f32, equal to the full computation's. The S positions are split into chunks of
    `chunk_positions(B, S, logits_chunk)`; the tail chunk is padded with zero hidden states and
    target 0, and the padded positions are cut off the result, so they get no cotangent and add
    nothing to any gradient. `lax.map` runs one chunk at a time and `jax.checkpoint` on its body
    makes the backward pass recompute a chunk's [B, C, V] logits instead of saving them: the
    temporaries are a few [B, C, V] arrays where the full path holds several [B, S, V] ones, for
    one extra head matmul. The entropy is only reported, so it carries no gradient.
    """
    rows, positions, _ = hidden.shape
    c = chunk_positions(rows, positions, logits_chunk)
    n = -(-positions // c)
    pad = n * c - positions
    hidden = jnp.pad(hidden, ((0, 0), (0, pad), (0, 0)))
    targets = jnp.pad(targets, ((0, 0), (0, pad)))
    # [B, n*C, ...] -> [n, B, C, ...]: chunk j holds positions [j*C, (j+1)*C) of every row.
    xs = (hidden.reshape(rows, n, c, -1).swapaxes(0, 1), targets.reshape(rows, n, c).swapaxes(0, 1))
    # The map sums the head's gradient over the chunks in its closed-over operand's dtype: float32,
    # so that a bfloat16 head is not rounded once per chunk; the matmul still runs in `head.dtype`.
    head32 = head.astype(jnp.float32)

    @jax.checkpoint
    def one_chunk(x):
        h, t = x  # [B, C, E], [B, C]
        token_logp, entropy = _token_stats(project_logits(h, head32.astype(head.dtype)), t)
        return token_logp, jax.lax.stop_gradient(entropy)

    token_logp, entropy = jax.lax.map(one_chunk, xs)  # [n, B, C]
    unchunk = lambda y: y.swapaxes(0, 1).reshape(rows, n * c)[:, :positions]  # noqa: E731
    return unchunk(token_logp), unchunk(entropy)

def model_inputs(params: Params, frozen: Params | None, cfg: TrainerConfig) -> tuple[Params, LoraAdapter | None]:
    """(the model's params, the adapter) of what the step trains: full fine-tuning trains the
    model's params themselves (`frozen` None); LoRA trains the adapter `params` on the frozen base."""
    if frozen is None:
        return params, None
    return frozen, LoraAdapter(params, cfg.lora.scale)


def scored_positions(loss_mask: jax.Array, width: int) -> jax.Array:
    """loss_mask [B, P] -> [B, width] int32: per row, the positions whose mask is > 0, in order,
    then the first unmasked ones to fill the width. A stable sort of "unmasked" puts the masked
    positions first; the indices of a row are distinct, so scattering values back to them writes
    each position at most once. Requires width >= the most masked positions of any row
    (`batch.scored_width`)."""
    return jnp.argsort(loss_mask <= 0, axis=1, stable=True)[:, :width].astype(jnp.int32)


def sequence_logprobs(graphdef: nnx.GraphDef, params: Params, tokens: jax.Array,
                      compute_dtype: str = "float32", remat: str = "none",
                      logits_chunk: int = 0, adapter: LoraAdapter | None = None,
                      scored_mask: jax.Array | None = None, scored_width: int = 0) -> tuple[jax.Array, jax.Array]:
    """Per-token log-prob of tokens[:, t] given tokens[:, :t], and the entropy of that prediction.

    tokens [B, T] int32 -> (logprobs [B, T] f32, entropy [B, T] f32); column 0 (no prefix) is 0.
    `remat` (`TrainerConfig.remat`) only changes what a backward pass keeps, never the values;
    `logits_chunk` (`TrainerConfig.logits_chunk`) > 0 computes the logits that many tokens at a
    time (`chunked_token_stats`), which changes the memory and roundoff only. `adapter` (LoRA) is
    merged into the layers' weights as the layer scan reaches them.

    `scored_mask` [B, T] with `scored_width` W > 0 (`TrainBatch.loss_mask`, `.scored_width`): only
    the positions where the mask is > 0 are needed, so the LM head runs at W positions a row
    (`scored_positions`) instead of T - 1, and the other positions hold 0, or the log-prob of a
    position that filled the width. The LM head is the largest matmul and its [B, T, V] logits the
    largest temporaries of a step: where the prompt is most of a row (the SmolLM2 recipes: 44
    prompt and 8 completion tokens), this cuts both by T / W (docs/memory.md). The masked
    positions' values are the full computation's up to float roundoff.
    """
    model = nnx.merge(graphdef, cast_floats(params, compute_dtype))
    adapter = None if adapter is None else cast_floats(adapter, compute_dtype)
    positions = jnp.broadcast_to(jnp.arange(tokens.shape[1], dtype=jnp.int32), tokens.shape)
    hidden = model.hidden_states(tokens, positions, remat=remat, adapter=adapter)[:, :-1]  # [B, T-1, E]
    targets = tokens[:, 1:]  # the prediction at position t is of token t + 1
    if scored_width:
        index = scored_positions(scored_mask[:, 1:], scored_width)  # [B, W]
        hidden = jnp.take_along_axis(hidden, index[..., None], axis=1)
        targets = jnp.take_along_axis(targets, index, axis=1)
    if logits_chunk:
        token_logp, entropy = chunked_token_stats(hidden, model.head(), targets, logits_chunk)
    else:
        token_logp, entropy = _token_stats(project_logits(hidden, model.head()), targets)
    if scored_width:
        rows = jnp.arange(tokens.shape[0])[:, None]
        unscored = jnp.zeros((tokens.shape[0], tokens.shape[1] - 1), jnp.float32)
        token_logp, entropy = (unscored.at[rows, index].set(x) for x in (token_logp, entropy))
    pad = ((0, 0), (1, 0))
    return jnp.pad(token_logp, pad), jnp.pad(entropy, pad)


@partial(jax.jit, static_argnames=("graphdef", "compute_dtype", "logits_chunk"))
def compute_logprobs(graphdef: nnx.GraphDef, params: Params, tokens: jax.Array,
                     compute_dtype: str = "float32", logits_chunk: int = 0,
                     adapter: LoraAdapter | None = None) -> jax.Array:
    """[B, T] per-token log-probs (e.g. the reference policy's, for `TrainBatch.ref_logprobs`)."""
    return sequence_logprobs(graphdef, params, tokens, compute_dtype, logits_chunk=logits_chunk, adapter=adapter)[0]


def _split_rows(tree: Any, k: int) -> Any:
    """[N, ...] -> [k, N/k, ...]; micro-batch j holds rows j, j+k, j+2k, ..."""
    return jax.tree.map(lambda x: x.reshape(x.shape[0] // k, k, *x.shape[1:]).swapaxes(0, 1), tree)


def _m2po_trusted_rows(graphdef: nnx.GraphDef, params: Params, micro: dict, cfg: TrainerConfig,
                       adapter: LoraAdapter | None, scored_width: int) -> jax.Array:
    """M2PO's whole-batch trust region (`losses.m2po_trusted`), a [k, N/k, T] mask.

    The trust region is a statistic of the whole batch's log(pi_prox / mu), so with several
    micro-batches one no-grad forward of each comes first (the cut-off does not depend on row
    order, so the split rows serve as they are)."""
    prox = jax.lax.map(lambda mb: sequence_logprobs(graphdef, params, mb[0], cfg.compute_dtype,
                                                    logits_chunk=cfg.logits_chunk, adapter=adapter,
                                                    scored_mask=mb[1], scored_width=scored_width)[0],
                       (micro["tokens"], micro["metric_weights"]))  # [k, N/k, T]
    mask = micro["metric_weights"] > 0
    log_ratio = jnp.where(mask, jax.lax.stop_gradient(prox) - micro["behaviour_logprobs"], 0.0)
    return m2po_trusted(log_ratio, mask, cfg.loss.m2_threshold)


def accumulate_gradients(graphdef: nnx.GraphDef, params: Params, batch: TrainBatch,
                         cfg: TrainerConfig, frozen: Params | None = None) -> tuple[Params, dict[str, jax.Array]]:
    """Full-batch gradient (f32, like params) and metrics, scanning over micro-batches. With
    `frozen` (LoRA), `params` is the adapter and the gradient is the adapter's only."""
    rows = {
        "tokens": batch.tokens,
        "behaviour_logprobs": batch.behaviour_logprobs,
        "ref_logprobs": batch.ref_logprobs,
        **batch_terms(batch.loss_mask, batch.rewards, batch.group_ids, cfg.loss),
    }
    micro = _split_rows(rows, cfg.num_microbatches)
    if cfg.loss.off_policy == "m2po" and cfg.num_microbatches > 1:
        model_params, adapter = model_inputs(params, frozen, cfg)
        micro["m2_trusted"] = _m2po_trusted_rows(graphdef, model_params, micro, cfg, adapter, batch.scored_width)

    def micro_loss(p: Params, mb: dict) -> tuple[jax.Array, dict]:
        model_params, adapter = model_inputs(p, frozen, cfg)
        logprobs, entropy = sequence_logprobs(graphdef, model_params, mb["tokens"], cfg.compute_dtype, cfg.remat,
                                              cfg.logits_chunk, adapter=adapter,
                                              scored_mask=mb["metric_weights"], scored_width=batch.scored_width)
        terms = {k: v for k, v in mb.items() if k != "tokens"}
        return policy_loss(logprobs, cfg=cfg.loss, entropy=entropy, **terms)

    grad_fn = jax.value_and_grad(micro_loss, has_aux=True)

    def body(acc: Params, mb: dict):
        (_, metrics), grads = grad_fn(params, mb)
        return jax.tree.map(jnp.add, acc, grads), metrics

    grads, per_micro = jax.lax.scan(body, jax.tree.map(jnp.zeros_like, params), micro)
    metrics = {k: v.max() if k in MAX_METRICS else v.sum() for k, v in per_micro.items()}
    return grads, metrics


def train_step(graphdef: nnx.GraphDef, params: Params, opt_state: optax.OptState, batch: TrainBatch,
               *, cfg: TrainerConfig, decay_paths: frozenset[str] | None = None, frozen: Params | None = None
               ) -> tuple[Params, optax.OptState, dict[str, jax.Array]]:
    """One optimizer update on `batch`; returns (params, opt_state, metrics). See module doc.

    Jit it where it is called, with `graphdef`, `cfg`, `decay_paths` static and `params`,
    `opt_state` donated (`Trainer` does, adding output shardings on a mesh). The optimizer is
    rebuilt from the static (hashable) `cfg.optim` and `decay_paths`, so two trainers of the
    same model and config share one compiled step. `frozen`: the base params of a LoRA step (not
    donated; `params` is then the adapter).
    """
    grads, metrics = accumulate_gradients(graphdef, params, batch, cfg, frozen)
    grad_norm = optax.global_norm(grads)
    finite = jnp.isfinite(metrics["loss"]) & jnp.isfinite(grad_norm)
    tx = make_optimizer(cfg.optim, decay_paths)

    def update(args: tuple) -> tuple[Params, optax.OptState]:
        g, state, p = args
        updates, new_state = tx.update(g, state, p)
        return optax.apply_updates(p, updates), new_state

    # A branch, not `where(finite, new, old)` over every leaf: the update then writes into the
    # donated buffers without keeping the new params and moments beside the old ones
    # (0.17-0.25 GiB of temporaries less at SmolLM2-135M, docs/memory.md).
    new_params, new_opt_state = jax.lax.cond(finite, update, lambda args: (args[2], args[1]),
                                             (grads, opt_state, params))
    valid = (batch.group_ids >= 0).astype(jnp.float32)
    metrics.update(
        grad_norm=grad_norm,
        skipped=1.0 - finite.astype(jnp.float32),
        reward_mean=jnp.sum(batch.rewards * valid) / jnp.maximum(valid.sum(), 1.0),
        tokens=jnp.sum(batch.loss_mask),
    )
    return new_params, new_opt_state, metrics
