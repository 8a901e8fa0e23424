"""The jitted train step through `Trainer`: accumulation, sharding, skipping, checkpoints.

All trainers here share one tiny model config and one batch shape, so the compiled steps are
reused across tests of this file.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxrl_async.models.config import ModelConfig
from jaxrl_async.models.transformer import Transformer
from jaxrl_async.sharding import make_mesh
from jaxrl_async.trainer.batch import pad_batch
from jaxrl_async.trainer.config import TrainerConfig
from jaxrl_async.trainer.losses import LossConfig
from jaxrl_async.trainer.optim import OptimConfig
from jaxrl_async.trainer.trainer import Trainer

MODEL = ModelConfig.tiny()
CFG = TrainerConfig(
    loss=LossConfig(off_policy="none", eps_high=0.28),  # clip against mu: exercises the clip
    # eps=1e-4: Adam with eps=1e-8 maps a ~1e-9 gradient to a full lr-sized step of either
    # sign, so two equal-to-roundoff gradients could give updates lr apart; a larger eps keeps
    # the update Lipschitz in the gradient and the comparisons below meaningful.
    optim=OptimConfig(lr=1e-3, eps=1e-4, warmup_steps=0, total_steps=100))


def make_trainer(cfg=CFG, mesh=None, seed=0):
    return Trainer(Transformer(MODEL, rngs=nnx.Rngs(seed)), cfg, mesh=mesh)


def make_batch(seed=0, nan_reward=False):
    """8 rows of 2 groups; behaviour log-probs near the model's so that ratios are near 1."""
    rng = np.random.default_rng(seed)
    samples = []
    for i in range(8):
        prompt = list(rng.integers(0, 256, rng.integers(1, 5)))
        completion = list(rng.integers(0, 256, rng.integers(1, 10)))
        logprobs = list(-np.log(MODEL.vocab_size) + rng.normal(0, 0.3, len(completion)))
        samples.append((prompt, completion, logprobs, float(rng.random()), i // 4))
    batch = pad_batch(samples, buckets=[16])
    if nan_reward:
        batch.rewards[0] = np.nan
    return batch


def assert_trees_close(a, b, atol):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), atol=atol, rtol=1e-4)


def test_a_step_changes_params_and_counts_the_version():
    trainer = make_trainer()
    before = trainer.params()
    metrics = trainer.step(make_batch())
    assert metrics["skipped"] == 0 and trainer.version == 1 and metrics["version"] == 1
    assert np.isfinite(metrics["loss"]) and metrics["tokens"] > 0
    assert 0 < metrics["clip_frac"] < 1
    moved = [float(jnp.abs(a - b).max()) for a, b in zip(jax.tree.leaves(before), jax.tree.leaves(trainer.params()))]
    assert min(moved) > 0  # every parameter gets a gradient
    assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(trainer.params()))


def test_gradient_accumulation_over_micro_batches_equals_one_big_batch():
    whole, accumulated = make_trainer(), make_trainer(TrainerConfig(loss=CFG.loss, optim=CFG.optim, num_microbatches=4))
    batch = make_batch()
    m_whole, m_acc = whole.step(batch), accumulated.step(batch)
    for key in ("loss", "grad_norm", "clip_frac", "ratio_mean", "ratio_max", "entropy"):
        assert m_acc[key] == pytest.approx(m_whole[key], rel=1e-5, abs=1e-7), key
    assert_trees_close(accumulated.params(), whole.params(), atol=1e-6)


def test_m2po_over_micro_batches_masks_with_the_whole_batch_cutoff():
    """M2PO's trust region spans the batch: accumulating over micro-batches changes nothing."""
    loss = LossConfig(off_policy="m2po", m2_threshold=0.02)
    whole = make_trainer(TrainerConfig(loss=loss, optim=CFG.optim))
    accumulated = make_trainer(TrainerConfig(loss=loss, optim=CFG.optim, num_microbatches=4))
    batch = make_batch()
    m_whole, m_acc = whole.step(batch), accumulated.step(batch)
    assert 0 < m_whole["m2po_masked_frac"] < 1  # the trust region binds on this batch
    for key in ("loss", "grad_norm", "m2po_masked_frac", "is_weight_mean"):
        assert m_acc[key] == pytest.approx(m_whole[key], rel=1e-5, abs=1e-7), key
    assert_trees_close(accumulated.params(), whole.params(), atol=1e-6)


def test_sharded_step_on_a_four_device_mesh_equals_the_unsharded_step():
    mesh = make_mesh(data=2, fsdp=2)
    sharded = make_trainer(TrainerConfig(loss=CFG.loss, optim=CFG.optim, num_microbatches=2), mesh=mesh)
    plain = make_trainer()
    emb = sharded.params(copy=False)["embed"]
    assert len(emb.sharding.device_set) == 4 and not emb.sharding.is_fully_replicated
    # Adam's moments are sharded like their params (FSDP also shards the optimizer state).
    moments = [x for x in jax.tree.leaves(sharded.state_dict()["opt_state"]) if x.shape == emb.shape]
    assert len(moments) == 2 and all(m.sharding == emb.sharding for m in moments)
    for seed in (0, 1):  # two steps: the second runs on sharded optimizer state
        m_sharded, m_plain = sharded.step(make_batch(seed)), plain.step(make_batch(seed))
        assert m_sharded["loss"] == pytest.approx(m_plain["loss"], rel=1e-5, abs=1e-7)
        assert m_sharded["grad_norm"] == pytest.approx(m_plain["grad_norm"], rel=1e-5)
    assert_trees_close(sharded.params(), plain.params(), atol=1e-6)


def test_non_finite_loss_skips_the_update_and_keeps_the_version():
    trainer = make_trainer()
    before = trainer.state_dict()
    before = jax.tree.map(np.asarray, before)
    metrics = trainer.step(make_batch(nan_reward=True))
    assert metrics["skipped"] == 1 and trainer.version == 0
    after = jax.tree.map(np.asarray, trainer.state_dict())
    for x, y in zip(jax.tree.leaves(before), jax.tree.leaves(after)):
        np.testing.assert_array_equal(x, y)  # params and optimizer state (its count too)
    assert trainer.step(make_batch())["skipped"] == 0 and trainer.version == 1


def test_state_dict_round_trips_through_orbax(tmp_path):
    import orbax.checkpoint as ocp

    trainer = make_trainer()
    trainer.step(make_batch(0))
    with ocp.StandardCheckpointer() as ckpt:
        ckpt.save(tmp_path / "ckpt", trainer.state_dict())
        ckpt.wait_until_finished()
        restored_state = ckpt.restore(tmp_path / "ckpt")
    restored = make_trainer(seed=1)
    restored.load_state_dict(restored_state)
    assert restored.version == 1
    m_a, m_b = trainer.step(make_batch(1)), restored.step(make_batch(1))
    assert m_a["loss"] == m_b["loss"] and restored.version == 2
    assert_trees_close(trainer.params(), restored.params(), atol=0)


def test_a_step_donates_its_params_and_optimizer_state():
    """The step's outputs reuse its inputs' buffers: no second params + Adam moments (docs/memory.md)."""
    trainer = make_trainer()
    old = jax.tree.leaves(trainer.state_dict()["params"]) + jax.tree.leaves(trainer.state_dict()["opt_state"])
    trainer.step(make_batch())
    assert all(leaf.is_deleted() for leaf in old if isinstance(leaf, jax.Array))


def test_a_step_waits_for_a_lent_reader_once_before_it_donates():
    trainer, calls = make_trainer(), []
    params = jax.tree.leaves(trainer.state_dict()["params"])
    trainer.lend(lambda: calls.append(all(not leaf.is_deleted() for leaf in params)))
    trainer.step(make_batch(0))
    trainer.step(make_batch(1))
    assert calls == [True]  # called once, before the first step donated the arrays it read


def test_a_step_after_a_background_checkpoint_save_donates_and_the_save_holds_the_old_weights(tmp_path):
    """On CPU the save reads the arrays in place: the step must wait for it (`Trainer.lend`), or it
    cannot donate them and holds a second copy of the params and optimizer state while it runs."""
    from jaxrl_async.checkpoint import Checkpointer

    trainer = make_trainer()
    before = trainer.params()
    checkpointer = Checkpointer(tmp_path, keep=1)
    state = trainer.state_dict()
    old = [leaf for leaf in jax.tree.leaves(state) if isinstance(leaf, jax.Array)]
    checkpointer.save(1, state, {"step": 1})
    trainer.lend(checkpointer.wait_written)
    trainer.step(make_batch())
    assert all(leaf.is_deleted() for leaf in old)
    restored, _ = checkpointer.restore(make_trainer(seed=1).state_dict())
    checkpointer.close()
    assert_trees_close(restored["params"], before, atol=0)


def test_load_state_dict_refuses_a_wrong_shape():
    trainer = make_trainer()
    state = trainer.state_dict()
    state["params"] = dict(state["params"], embed=np.zeros((3, 3), np.float32))
    with pytest.raises(ValueError, match=r"^params/embed is float32\[3, 3\] in the state given to load_state_dict; expected float32\["):
        trainer.load_state_dict(state)


def test_batch_rows_must_divide_into_micro_batches_and_shards():
    trainer = make_trainer(TrainerConfig(loss=CFG.loss, optim=CFG.optim, num_microbatches=3))
    with pytest.raises(ValueError, match="rows=8"):
        trainer.step(make_batch())


def test_bfloat16_compute_keeps_float32_params_and_a_close_loss():
    bf16 = make_trainer(TrainerConfig(loss=CFG.loss, optim=CFG.optim, compute_dtype="bfloat16"))
    f32 = make_trainer()
    batch = make_batch()
    m_bf16, m_f32 = bf16.step(batch), f32.step(batch)
    assert m_bf16["skipped"] == 0
    assert m_bf16["entropy"] == pytest.approx(m_f32["entropy"], rel=1e-2)
    assert m_bf16["grad_norm"] == pytest.approx(m_f32["grad_norm"], rel=0.1)
    assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(bf16.params()))
    # What an engine running bfloat16 weights gets published:
    assert all(x.dtype == jnp.bfloat16 for x in jax.tree.leaves(bf16.params(dtype="bfloat16")))


def test_logprobs_are_those_the_loss_uses():
    """With behaviour = the trainer's own log-probs, the ratio against mu is exactly 1."""
    trainer = make_trainer()
    batch = make_batch()
    batch = batch.replace(behaviour_logprobs=np.asarray(trainer.logprobs(batch.tokens)) * batch.loss_mask)
    metrics = trainer.step(batch)
    assert metrics["ratio_mean"] == pytest.approx(1.0, abs=1e-6)
    assert metrics["ratio_max"] == pytest.approx(1.0, abs=1e-5)
    assert metrics["clip_frac"] == 0


def test_chunked_logits_train_like_whole_logits_and_score_like_their_loss():
    """`logits_chunk` reaches the jitted step and `Trainer.logprobs`: the same metrics and
    weights after two steps, and the chunked log-probs are the ones its loss uses."""
    whole, chunked = make_trainer(), make_trainer(dataclasses.replace(CFG, logits_chunk=24))
    batch = make_batch()
    for step in range(2):
        m_whole, m_chunked = whole.step(make_batch(step)), chunked.step(make_batch(step))
        for key in ("loss", "entropy", "grad_norm", "clip_frac"):
            assert m_chunked[key] == pytest.approx(m_whole[key], rel=1e-5, abs=1e-7), key
    assert_trees_close(chunked.params(), whole.params(), atol=1e-6)
    np.testing.assert_allclose(np.asarray(chunked.logprobs(batch.tokens)), np.asarray(whole.logprobs(batch.tokens)),
                               atol=1e-5)
    batch = batch.replace(behaviour_logprobs=np.asarray(chunked.logprobs(batch.tokens)) * batch.loss_mask)
    assert chunked.step(batch)["ratio_max"] == pytest.approx(1.0, abs=1e-5)
