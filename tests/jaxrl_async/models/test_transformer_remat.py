"""`trainer.remat`: every policy computes the `none` loss and gradients, and actually remats.

Remat changes only what the backward pass keeps, so each policy must reproduce the `none`
loss and gradients of the train step (`accumulate_gradients`; float32, tiny model, with and
without micro-batches); and each must compile the step to a smaller temporary allocation than
`none` (`full` to under half) on a shape where the layer scan's activations dominate — if a
policy were silently not applied, the two would compile alike.
"""

import contextlib
import io

import jax
import numpy as np
import pytest
from flax import nnx

from jaxrl_async.models.config import ModelConfig
from jaxrl_async.models.transformer import REMAT_CHOICES, REMAT_POLICIES, Transformer
from jaxrl_async.trainer.batch import pad_batch
from jaxrl_async.trainer.config import TrainerConfig
from jaxrl_async.trainer.losses import LossConfig
from jaxrl_async.trainer.optim import make_optimizer
from jaxrl_async.trainer.step import accumulate_gradients, sequence_logprobs, train_step

MODEL = ModelConfig.tiny()


def make_batch(model: ModelConfig, rows: int, seq: int, seed: int = 0):
    """`rows` rows of groups of 4, padded to `seq`; behaviour log-probs near uniform."""
    rng = np.random.default_rng(seed)
    samples = []
    for i in range(rows):
        prompt = list(rng.integers(0, 256, rng.integers(1, seq // 4)))
        completion = list(rng.integers(0, 256, rng.integers(1, seq - len(prompt))))
        logprobs = list(-np.log(model.vocab_size) + rng.normal(0, 0.3, len(completion)))
        samples.append((prompt, completion, logprobs, float(rng.random()), i // 4))
    return pad_batch(samples, buckets=[seq])


def split_params(model: ModelConfig):
    graphdef, state = nnx.split(Transformer(model, rngs=nnx.Rngs(0)), nnx.Param)
    return graphdef, state.to_pure_dict()


@pytest.fixture(scope="module")
def tiny():
    graphdef, params = split_params(MODEL)
    return graphdef, params, make_batch(MODEL, rows=8, seq=16)


def loss_and_grads(graphdef, params, batch, remat: str, num_microbatches: int):
    cfg = TrainerConfig(loss=LossConfig(), num_microbatches=num_microbatches, remat=remat)
    grads, metrics = jax.jit(accumulate_gradients, static_argnums=(0, 3))(graphdef, params, batch, cfg)
    return float(metrics["loss"]), grads


@pytest.fixture(scope="module")
def reference(tiny):
    """num_microbatches -> the `none` loss and gradients."""
    return {k: loss_and_grads(*tiny, "none", k) for k in (1, 2)}


@pytest.mark.parametrize("num_microbatches", [1, 2])
@pytest.mark.parametrize("remat", [r for r in REMAT_CHOICES if r != "none"])
def test_every_remat_policy_gives_the_loss_and_gradients_of_none(tiny, reference, remat, num_microbatches):
    # Only float32 roundoff may differ (XLA fuses the recompute differently): measured <= 5e-7
    # of each leaf's largest entry; a wrong gradient (e.g. a residual of the hand-written
    # attention backward taken from the wrong recompute) is off by O(1).
    ref_loss, ref_grads = reference[num_microbatches]
    loss, grads = loss_and_grads(*tiny, remat, num_microbatches)
    np.testing.assert_allclose(loss, ref_loss, rtol=0, atol=1e-6)
    flat_ref = jax.tree_util.tree_flatten_with_path(ref_grads)[0]
    for (path, ref), got in zip(flat_ref, jax.tree.leaves(grads), strict=True):
        scale = float(np.abs(ref).max())
        assert scale > 0, f"{jax.tree_util.keystr(path)}: zero gradient, the comparison would be empty"
        np.testing.assert_allclose(np.asarray(got), np.asarray(ref), rtol=0, atol=2e-6 * scale,
                                   err_msg=f"remat={remat} grad {jax.tree_util.keystr(path)}")


def compiled_temp_bytes(graphdef, params, batch, remat: str) -> int:
    """XLA's temporary allocation of the whole jitted train step (as Trainer jits it)."""
    cfg = TrainerConfig(remat=remat)
    opt_state = jax.eval_shape(make_optimizer(cfg.optim).init, params)
    step = jax.jit(train_step, static_argnames=("graphdef", "cfg", "decay_paths"),
                   donate_argnames=("params", "opt_state"))
    compiled = step.lower(graphdef, params, opt_state, batch, cfg=cfg, decay_paths=None).compile()
    return compiled.memory_analysis().temp_size_in_bytes


def test_every_policy_compiles_the_train_step_to_a_smaller_temporary_than_none():
    # 8 layers and 8 x 128 tokens over a 264-token vocab: the layers' activations, not the
    # logits, dominate the step's temporaries. `full` keeps only each layer's input (measured:
    # 0.32x of none); every policy keeps less than none (plain dots_saveable would keep the
    # attention scores: 1.08x).
    model = ModelConfig.tiny(num_layers=8)
    graphdef, params = split_params(model)
    params = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), params)
    batch = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), make_batch(model, rows=8, seq=128))
    temp = {remat: compiled_temp_bytes(graphdef, params, batch, remat) for remat in REMAT_CHOICES}
    assert temp["full"] < 0.5 * temp["none"], temp
    assert all(temp[r] < temp["none"] for r in REMAT_POLICIES), temp


def saved_residuals(graphdef, params, tokens, remat: str) -> str:
    def logprob_sum(params):
        return sequence_logprobs(graphdef, params, tokens, remat=remat)[0].sum()

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        jax.ad_checkpoint.print_saved_residuals(logprob_sum, params)
    return buf.getvalue()


def test_named_policies_find_the_names_inside_the_hand_written_attention():
    # The attention's log-sum-exp is named inside its custom_vjp forward; save_attn must find it
    # there (the layer scan then stacks it, [L, B, K, G*T, 1]), or it silently degrades to `full`.
    graphdef, params = split_params(MODEL)
    tokens = make_batch(MODEL, rows=2, seq=16).tokens
    heads, kv = MODEL.num_heads, MODEL.num_kv_heads
    lse = f"f32[{MODEL.num_layers},2,{kv},{heads // kv * 16},1] output of scan"
    assert lse in saved_residuals(graphdef, params, tokens, "save_attn")
    assert lse not in saved_residuals(graphdef, params, tokens, "full")


def test_remat_must_name_a_policy_of_the_registry():
    assert set(REMAT_CHOICES) == {"none", *REMAT_POLICIES}
    for name in REMAT_CHOICES:
        assert TrainerConfig(remat=name).remat == name
    with pytest.raises(ValueError, match=r"^trainer.remat='offload': must be one of none, full, dots"):
        TrainerConfig(remat="offload")
