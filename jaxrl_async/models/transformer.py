"""Decoder-only LM for the Llama / Qwen2 / Qwen3 family, in Flax NNX.

Read top to bottom: RMSNorm, SwiGLU MLP, one decoder layer (GQA attention with optional Qwen
biases and q/k norm), the parameters, the remat policies of the layer scan, the `Transformer`,
and the generation forward. RoPE is models/rope.py; the attention and the KV cache are
models/attention.py.

Two layouts of the same parameters, for two jobs:
- training / scoring (`Transformer.__call__`): layer parameters stacked along a leading `layers`
  axis and scanned with `jax.lax.scan`, so compile time does not grow with depth;
- generation (`inference_weights` + `forward_layers`): one array per layer and an unrolled loop,
  with a per-layer KV cache. On CPU, slicing a layer out of a stack inside a compiled decode step
  copies it, every step; per-layer arrays are read in place (the copies are about a third of a
  stacked decode step for SmolLM2-135M on 2 cores).
Every parameter declares its logical axes once, as Variable metadata (`logical_axes`);
`jaxrl_async.sharding` derives shardings from them.

Numerics follow transformers' Llama: RMSNorm in float32 then cast back, RoPE with the
rotate-half layout, softmax in float32. Attention scores are accumulated in float32
(transformers keeps them in the activation dtype), which only matters for bfloat16. Attention
and the SwiGLU MLP have hand-written gradients that recompute rather than save (see
models/attention.py `attention` and `mlp` here).

Deliberately left out: sliding-window attention, MoE, attention/logit soft-capping.
"""

from __future__ import annotations

import math
from functools import partial

import jax
import jax.numpy as jnp
from flax import nnx

from jaxrl_async.models.attention import ATTN_LSE, ATTN_OUT, causal_attend
from jaxrl_async.models.config import ModelConfig
from jaxrl_async.models.lora import LoraAdapter, ResidentAdapters, TokenAdapters, adapter_output, merge_layers
from jaxrl_async.models.rope import apply_rope, rope_cos_sin

# Logical axis names used in `logical_axes` metadata (see jaxrl_async/sharding.py).
LAYERS, VOCAB, EMBED, HEADS, KV_HEADS, HEAD_DIM, MLP = (
    "layers", "vocab", "embed", "heads", "kv_heads", "head_dim", "mlp")


def _dtype(cfg: ModelConfig) -> jnp.dtype:
    return jnp.dtype(cfg.dtype)


# -------------------------------------------------------------------------------- RMSNorm


def rms_norm(x: jax.Array, weight: jax.Array, eps: float) -> jax.Array:
    """RMSNorm over the last axis, computed in float32 and cast back before the weight."""
    x32 = x.astype(jnp.float32)
    x32 = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    return weight * x32.astype(x.dtype)


# ---------------------------------------------------------------------------------- layer


def dense(x: jax.Array, w: jax.Array, in_axes: int = 1) -> jax.Array:
    """x [..., I] times w [I..., O...] (the first `in_axes` axes of w are contracted) -> [..., O...].

    The token axes are flattened into one so that each weight gradient is a plain 2-D matmul:
    contracting batch and time as two axes made XLA:CPU transpose the [B, T, F] activation
    gradient element by element before the matmul, which cost more than the matmuls themselves.
    """
    in_shape, out_shape = w.shape[:in_axes], w.shape[in_axes:]
    lead = x.shape[:x.ndim - in_axes]
    y = x.reshape(-1, math.prod(in_shape)) @ w.reshape(math.prod(in_shape), -1)
    return y.reshape(*lead, *out_shape)


@jax.custom_vjp
def mlp(h: jax.Array, w_gate: jax.Array, w_up: jax.Array, w_down: jax.Array) -> jax.Array:
    """SwiGLU MLP: (silu(h @ w_gate) * (h @ w_up)) @ w_down; h [..., E] -> [..., E].

    The gradient is hand-written: it saves h, gate and up and recomputes silu(gate) * up in the
    backward pass. Autodiff saved four [tokens, F] activations per layer, and zero-filling and
    writing them into the layer scan's stacked residuals cost more than the elementwise
    recompute (train step 8-12% faster). Tokens are flattened as in `dense`.
    """
    return _mlp_fwd(h, w_gate, w_up, w_down)[0]


def _mlp_fwd(h, w_gate, w_up, w_down):
    h2 = h.reshape(-1, h.shape[-1])  # [N, E]
    gate, up = h2 @ w_gate, h2 @ w_up  # [N, F]
    y = (jax.nn.silu(gate) * up) @ w_down
    return y.reshape(h.shape), (h2, gate, up, w_gate, w_up, w_down)


def _mlp_bwd(res, d_y):
    h2, gate, up, w_gate, w_up, w_down = res
    d_y2 = d_y.reshape(-1, d_y.shape[-1])
    sig = jax.nn.sigmoid(gate)
    silu = gate * sig
    d_w_down = (silu * up).T @ d_y2
    d_act = d_y2 @ w_down.T  # [N, F]
    d_gate = d_act * up * (sig * (1 + gate * (1 - sig)))  # silu'(g) = sig(g) (1 + g (1 - sig(g)))
    d_up = d_act * silu
    d_h = d_gate @ w_gate.T + d_up @ w_up.T
    return d_h.reshape(d_y.shape), h2.T @ d_gate, h2.T @ d_up, d_w_down


mlp.defvjp(_mlp_fwd, _mlp_bwd)


def adapted_dense(x: jax.Array, p: dict, name: str, lora: TokenAdapters | None, in_axes: int = 1) -> jax.Array:
    """`dense(x, p[name])`, plus the token's resident adapter's side branch when `lora` adapts
    `name` (models/lora.py `adapter_output`: y = x W + scale (x A[v]) B[v], unmerged)."""
    y = dense(x, p[name], in_axes)
    if lora is not None and name in lora.params:
        y = y + adapter_output(x, lora.params[name], lora.select, lora.scale, in_axes)
    return y


def decoder_layer(cfg: ModelConfig, p: dict, x: jax.Array, cos: jax.Array, sin: jax.Array, attend,
                  lora: TokenAdapters | None = None):
    """One pre-norm block. x [B, T, E]; p holds this layer's parameters (no layer axis).

    `attend(q [B, T, H, D], k, v [B, T, K, D]) -> (out [B, T, H, D], aux)` is the attention
    (models/attention.py `causal_attend` or `cached_attend`); returns (x, aux). `lora`
    (generation only, no gradient): resident adapters applied unmerged per token
    (`adapted_dense`); None runs the weights alone.
    """
    h = rms_norm(x, p["attn_norm"], cfg.rms_norm_eps)  # [B, T, E]
    q = adapted_dense(h, p, "wq", lora)  # [B, T, H, D]
    k = adapted_dense(h, p, "wk", lora)  # [B, T, K, D]
    v = adapted_dense(h, p, "wv", lora)  # [B, T, K, D]
    if cfg.attention_bias:
        q, k, v = q + p["bq"], k + p["bk"], v + p["bv"]
    if cfg.qk_norm:
        q = rms_norm(q, p["q_norm"], cfg.rms_norm_eps)
        k = rms_norm(k, p["k_norm"], cfg.rms_norm_eps)
    q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    attn, aux = attend(q, k, v)
    x = x + adapted_dense(attn, p, "wo", lora, in_axes=2)

    h = rms_norm(x, p["mlp_norm"], cfg.rms_norm_eps)
    if lora is None:
        x = x + mlp(h, p["w_gate"], p["w_up"], p["w_down"])
    else:  # the MLP's forward with each projection adapted (no custom gradient needed here)
        act = jax.nn.silu(adapted_dense(h, p, "w_gate", lora)) * adapted_dense(h, p, "w_up", lora)
        x = x + adapted_dense(act, p, "w_down", lora)
    return x, aux


# --------------------------------------------------------------------------------- model


def param_specs(cfg: ModelConfig) -> dict[str, tuple[tuple[int, ...], tuple[str | None, ...], str]]:
    """Every parameter, declared once: path -> (shape, logical axes, init).

    Paths under `layers/` are stacked over a leading `layers` axis. Init follows HF
    (normal(0.02) weights, unit norms, zero biases).
    """
    L, E, H, K, D, F, V = (cfg.num_layers, cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads,
                           cfg.head_dim, cfg.intermediate_size, cfg.vocab_size)
    specs = {
        "embed": ((V, E), (VOCAB, EMBED), "normal"),
        "layers/attn_norm": ((L, E), (LAYERS, None), "ones"),
        "layers/wq": ((L, E, H, D), (LAYERS, EMBED, HEADS, HEAD_DIM), "normal"),
        "layers/wk": ((L, E, K, D), (LAYERS, EMBED, KV_HEADS, HEAD_DIM), "normal"),
        "layers/wv": ((L, E, K, D), (LAYERS, EMBED, KV_HEADS, HEAD_DIM), "normal"),
        "layers/wo": ((L, H, D, E), (LAYERS, HEADS, HEAD_DIM, EMBED), "normal"),
    }
    if cfg.attention_bias:
        specs["layers/bq"] = ((L, H, D), (LAYERS, HEADS, HEAD_DIM), "zeros")
        specs["layers/bk"] = ((L, K, D), (LAYERS, KV_HEADS, HEAD_DIM), "zeros")
        specs["layers/bv"] = ((L, K, D), (LAYERS, KV_HEADS, HEAD_DIM), "zeros")
    if cfg.qk_norm:
        specs["layers/q_norm"] = ((L, D), (LAYERS, None), "ones")
        specs["layers/k_norm"] = ((L, D), (LAYERS, None), "ones")
    specs.update({
        "layers/mlp_norm": ((L, E), (LAYERS, None), "ones"),
        "layers/w_gate": ((L, E, F), (LAYERS, EMBED, MLP), "normal"),
        "layers/w_up": ((L, E, F), (LAYERS, EMBED, MLP), "normal"),
        "layers/w_down": ((L, F, E), (LAYERS, MLP, EMBED), "normal"),
        "final_norm": ((E,), (None,), "ones"),
    })
    if not cfg.tie_word_embeddings:
        specs["lm_head"] = ((E, V), (EMBED, VOCAB), "normal")
    return specs


def layer_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """{name: stacked shape} of the layers' parameters (`param_specs` under `layers/`)."""
    return {path.split("/", 1)[1]: shape for path, (shape, _, _) in param_specs(cfg).items()
            if path.startswith("layers/")}


@partial(jax.jit, static_argnums=(1, 2))
def _init_values(key: jax.Array, shapes_inits: tuple, dtype) -> tuple[jax.Array, ...]:
    # One jitted call and one random draw for all weights: eager jax.random compiles per op and
    # shape, and one threefry per tensor makes compilation slow.
    sizes = [math.prod(shape) if init == "normal" else 0 for shape, init in shapes_inits]
    flat = 0.02 * jax.random.normal(key, (sum(sizes),), jnp.float32)
    out, offset = [], 0
    for (shape, init), size in zip(shapes_inits, sizes):
        if init == "ones":
            out.append(jnp.ones(shape, dtype))
        elif init == "zeros":
            out.append(jnp.zeros(shape, dtype))
        else:
            out.append(flat[offset:offset + size].reshape(shape).astype(dtype))
        offset += size
    return tuple(out)


def _init_params(cfg: ModelConfig, rngs: nnx.Rngs) -> dict[str, nnx.Param]:
    specs = param_specs(cfg)
    values = _init_values(rngs.params(), tuple((sh, init) for sh, _, init in specs.values()),
                          _dtype(cfg))
    return {path: nnx.Param(value, logical_axes=axes)
            for (path, (_, axes, _)), value in zip(specs.items(), values)}


class DecoderLayers(nnx.Module):
    """Parameters of all layers, stacked on a leading `layers` axis (scanned by Transformer)."""

    def __init__(self, params: dict[str, nnx.Param]):
        for name, param in params.items():
            setattr(self, name, param)

    def stacked(self) -> dict[str, jax.Array]:
        return {name: var.get_value() for name, var in vars(self).items() if isinstance(var, nnx.Param)}


def _embed(cfg: ModelConfig, embed: jax.Array, tokens: jax.Array, positions: jax.Array):
    """Token embeddings [B, T, E] and the RoPE tables of the positions."""
    return embed[tokens], *rope_cos_sin(cfg, positions)


def unembedding(cfg: ModelConfig, embed: jax.Array, lm_head: jax.Array | None) -> jax.Array:
    """The LM head as an [E, V] matrix: the embedding's transpose when tied (a transposed
    operand, not a copy), else `lm_head`."""
    return embed.T if cfg.tie_word_embeddings else lm_head


def project_logits(x: jax.Array, head: jax.Array) -> jax.Array:
    """Final-normed hidden states x [..., E] times the head [E, V] -> float32 logits [..., V].

    Tokens are flattened as in `dense`. The one rule for logits: the full forward and the
    trainer's chunked log-probs (jaxrl_async/trainer/step.py) both call it."""
    logits = jnp.dot(x.reshape(-1, x.shape[-1]), head, preferred_element_type=jnp.float32)
    return logits.reshape(*x.shape[:-1], -1).astype(jnp.float32)


def _logits(cfg: ModelConfig, x: jax.Array, final_norm: jax.Array, embed: jax.Array,
            lm_head: jax.Array | None) -> jax.Array:
    """Final norm and LM head: x [B, T, E] -> float32 logits [B, T, V]."""
    x = rms_norm(x, final_norm, cfg.rms_norm_eps)
    return project_logits(x, unembedding(cfg, embed, lm_head))


# Rematerialisation (`Transformer.__call__(remat=...)`, `TrainerConfig.remat`): the scanned layer
# runs under `jax.checkpoint` with one of these policies, which says what its backward pass may
# keep; the rest is recomputed from the layer's input (the scan carry, always kept). "none" does
# not wrap the layer: autodiff keeps what it needs, the attention and MLP their custom_vjp
# residuals. To add one: a name and a `jax.checkpoint_policies` policy; the config validates
# against REMAT_CHOICES.
_cp = jax.checkpoint_policies
_ATTENTION = _cp.save_only_these_names(ATTN_OUT, ATTN_LSE)
REMAT_POLICIES = {
    # The layer input only: the backward pass runs every layer's forward again.
    "full": _cp.nothing_saveable,
    # Every matmul output, so only elementwise ops (norms, RoPE, SiLU) are recomputed; inside the
    # attention that is its output and log-sum-exp. Plain `dots_saveable` would keep the float32
    # [T, S] score matrices instead, more than "none" keeps (1.3x the step's temporary memory at
    # benchmarks/bench_remat.py's 4.7b shape), since the hand-written attention backward
    # recomputes them.
    "dots": _cp.save_from_both_policies(_cp.dots_saveable, _ATTENTION),
    # The matmuls without batch dimensions (projections, MLP); the attention is recomputed.
    "dots_no_batch": _cp.dots_with_no_batch_dims_saveable,
    # The attention's output and log-sum-exp only: about "full"'s memory (one [B, T, H, D]
    # activation more per layer) without recomputing the quadratic attention forward.
    "save_attn": _ATTENTION,
}
REMAT_CHOICES = ("none", *REMAT_POLICIES)


class Transformer(nnx.Module):
    """Token ids -> float32 logits: the training / teacher-forced scoring forward.

    The layers run under `jax.lax.scan` over the stacked parameters, so compile time does not
    grow with depth (this graph is also differentiated). Generation uses the same layers through
    `InferenceWeights` and `forward_layers` instead.
    """

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        params = _init_params(cfg, rngs)
        self.embed = params["embed"]
        self.layers = DecoderLayers({path.split("/", 1)[1]: p for path, p in params.items()
                                     if path.startswith("layers/")})
        self.final_norm = params["final_norm"]
        if not cfg.tie_word_embeddings:
            self.lm_head = params["lm_head"]

    def __call__(self, tokens: jax.Array, positions: jax.Array,
                 segments: jax.Array | None = None, *, remat: str = "none",
                 adapter: LoraAdapter | None = None) -> jax.Array:
        """tokens/positions int32 [B, T] -> float32 logits [B, T, V].

        Causal attention among the T tokens of a row (right padding is harmless); with
        `segments` [B, T], only among tokens of the same segment (packed sequences). `adapter`
        (models/lora.py) is merged into each layer's weights as the scan reaches it.
        """
        return project_logits(self.hidden_states(tokens, positions, segments, remat=remat, adapter=adapter),
                              self.head())

    def head(self) -> jax.Array:
        """The LM head as [E, V] (`unembedding`): `project_logits(hidden_states(...), head())`
        are the logits of `__call__`."""
        return unembedding(self.cfg, self.embed[...], None if self.cfg.tie_word_embeddings else self.lm_head[...])

    def hidden_states(self, tokens: jax.Array, positions: jax.Array, segments: jax.Array | None = None, *,
                      remat: str = "none", adapter: LoraAdapter | None = None) -> jax.Array:
        """The last layer's output after the final norm, [B, T, E] in the params' dtype: what the
        LM head multiplies, for a caller that computes the logits in pieces (the trainer's
        `logits_chunk`) instead of as one [B, T, V] array."""
        cfg = self.cfg
        x, cos, sin = _embed(cfg, self.embed[...], tokens, positions)
        attend = causal_attend(segments)

        def layer(x, p):
            if adapter is not None:  # one layer's weights and adapter: merged here, so only the
                p = merge_layers(*p, adapter.scale)  # adapter's slice is differentiated
            return decoder_layer(cfg, p, x, cos, sin, attend)[0], None

        if remat != "none":
            # prevent_cse=False: the scan already keeps XLA from merging the recompute back into
            # the forward pass, so prevent_cse's optimization barriers would only constrain it.
            layer = jax.checkpoint(layer, policy=REMAT_POLICIES[remat], prevent_cse=False)
        xs = self.layers.stacked() if adapter is None else (self.layers.stacked(), adapter.params["layers"])
        x, _ = jax.lax.scan(layer, x, xs)
        return rms_norm(x, self.final_norm[...], cfg.rms_norm_eps)


# ------------------------------------------------------------------- generation forward


def inference_weights(params: dict) -> dict:
    """The parameters in the generation layout: a tuple of per-layer dicts under "layers".

    `params` is `nnx.to_pure_dict` of the model's `nnx.Param` state (stacked layers). Under jit
    this copies every layer out of the stack once, when weights are installed, instead of in
    every decode step (XLA:CPU copied each layer's slice of the stacked weights per step: about
    half of a batch-1 decode step). The same weights, the same numerics; on GPU/TPU it costs one
    copy per weight update.
    """
    layers = params["layers"]
    num_layers = next(iter(layers.values())).shape[0]
    out = {name: value for name, value in params.items() if name != "layers"}
    out["layers"] = tuple({name: value[i] for name, value in layers.items()} for i in range(num_layers))
    return out


def forward_layers(cfg: ModelConfig, weights: dict, tokens: jax.Array, positions: jax.Array,
                   attends, rows: jax.Array | None = None) -> tuple[jax.Array, list]:
    """Embedding and every layer over `inference_weights`, one `attend` per layer (unrolled).

    Weights holding "adapters" (`ResidentAdapters`: the engine's pinned versions) adapt each
    token with its slot's entry; rows [B, T] int32 names each token's slot (clipped into range,
    so padding takes some slot's entry and is dropped anyway). Returns the last hidden state
    [B, T, E] (before the final norm) and each layer's aux.
    """
    x, cos, sin = _embed(cfg, weights["embed"], tokens, positions)
    resident: ResidentAdapters | None = weights.get("adapters")
    select = None
    if resident is not None:
        entries = jnp.take(resident.slot_entry, rows, mode="clip")  # [B, T]
        select = jax.nn.one_hot(entries, next(iter(resident.layers[0].values()))["a"].shape[0], dtype=jnp.float32)
    auxes = []
    for i, (p, attend) in enumerate(zip(weights["layers"], attends, strict=True)):
        lora = None if resident is None else TokenAdapters(resident.layers[i], select, resident.scale)
        x, aux = decoder_layer(cfg, p, x, cos, sin, attend, lora)
        auxes.append(aux)
    return x, auxes


def inference_logits(cfg: ModelConfig, weights: dict, x: jax.Array) -> jax.Array:
    """Final norm and LM head over `inference_weights`: x [B, T, E] -> float32 logits [B, T, V]."""
    return _logits(cfg, x, weights["final_norm"], weights["embed"], weights.get("lm_head"))
