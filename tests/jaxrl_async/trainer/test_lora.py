"""LoRA through `Trainer` (`trainer.lora.rank > 0`): a frozen base, gradients and optimizer state on
the adapter only, every loss preset / remat / chunked logits / micro-batches, exact resume, and
rank 0 as full fine-tuning."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxrl_async.models.lora import LoraAdapter, merged_params
from jaxrl_async.models.transformer import Transformer
from jaxrl_async.trainer.config import LoraConfig, TrainerConfig
from jaxrl_async.trainer.losses import LossConfig
from jaxrl_async.trainer.step import sequence_logprobs
from jaxrl_async.trainer.trainer import Trainer
from tests.jaxrl_async.trainer.test_trainer import CFG, MODEL, make_batch, make_trainer

LORA = dataclasses.replace(CFG, lora=LoraConfig(rank=4, alpha=8.0))


def leaves(tree):
    return {jax.tree_util.keystr(p): np.asarray(x) for p, x in jax.tree_util.tree_flatten_with_path(tree)[0]}


def test_the_base_stays_bit_identical_and_only_the_adapter_trains():
    trainer = make_trainer(LORA)
    base = leaves(trainer._frozen)
    adapter = trainer.params()
    assert set(adapter["layers"]) == {"wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down"}
    for _ in range(3):
        metrics = trainer.step(make_batch())
        assert metrics["skipped"] == 0 and metrics["grad_norm"] > 0
    after = leaves(trainer._frozen)
    assert base.keys() == after.keys()
    assert all(np.array_equal(base[k], after[k]) for k in base)
    moved = trainer.params()
    assert not np.array_equal(np.asarray(moved["layers"]["wq"]["b"]), np.asarray(adapter["layers"]["wq"]["b"]))


def test_gradients_and_optimizer_state_exist_for_the_adapter_only():
    trainer = make_trainer(LORA)
    adapter_paths = set(leaves(trainer.params()))
    moments = leaves(trainer.state_dict()["opt_state"])
    shaped = {k for k, v in moments.items() if v.ndim > 0}
    # Adam's mu and nu: one per adapter leaf, nothing shaped like a base weight.
    assert len(shaped) == 2 * len(adapter_paths)
    assert all(any(k.endswith(p) for p in adapter_paths) for k in shaped)
    n_opt = sum(v.size for v in moments.values())
    n_base = sum(x.size for x in jax.tree.leaves(trainer._frozen))
    assert n_opt < 0.2 * n_base


def test_an_untrained_adapter_is_the_base_model_and_its_logprobs_follow_the_merge():
    trainer = make_trainer(LORA)
    full = make_trainer()  # same seed: the same base
    tokens = jnp.asarray(make_batch().tokens)
    np.testing.assert_array_equal(np.asarray(trainer.logprobs(tokens)), np.asarray(full.logprobs(tokens)))
    trainer.step(make_batch())
    merged = merged_params(jax.tree.map(jnp.asarray, trainer._frozen), LoraAdapter(trainer.params(), LORA.lora.scale))
    want = sequence_logprobs(trainer.graphdef, merged, tokens)[0]
    np.testing.assert_allclose(np.asarray(trainer.logprobs(tokens)), np.asarray(want), atol=2e-5)


@pytest.mark.parametrize("loss, extra", [
    (LossConfig(off_policy="m2po", aggregation="token_mean"), {"num_microbatches": 2}),
    (LossConfig(off_policy="cispo", aggregation="token_mean"), {"remat": "full", "logits_chunk": 8}),
    (LossConfig(advantage="drgrpo", aggregation="drgrpo", norm_len=16), {"remat": "dots"}),
    (LossConfig(off_policy="decoupled", decoupled_is_cap=5.0), {"num_microbatches": 2, "logits_chunk": 8}),
])
def test_every_loss_preset_trains_the_adapter_with_remat_chunks_and_micro_batches(loss, extra):
    cfg = dataclasses.replace(LORA, loss=loss, **extra)
    plain = dataclasses.replace(LORA, loss=loss)
    a, b = make_trainer(cfg), make_trainer(plain)
    ma, mb = a.step(make_batch()), b.step(make_batch())
    assert ma["skipped"] == 0 and ma["grad_norm"] > 0
    np.testing.assert_allclose(ma["grad_norm"], mb["grad_norm"], rtol=1e-3)
    for x, y in zip(jax.tree.leaves(a.params()), jax.tree.leaves(b.params())):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), atol=1e-5)


def test_a_resumed_adapter_continues_exactly():
    straight = make_trainer(LORA)
    for seed in range(3):
        straight.step(make_batch(seed))
    first = make_trainer(LORA)
    first.step(make_batch(0))
    saved = jax.device_get(first.state_dict())
    assert set(leaves(saved["params"])) == set(leaves(first.params()))  # the adapter, not the base
    resumed = make_trainer(LORA)
    resumed.load_state_dict(saved)
    for seed in (1, 2):
        resumed.step(make_batch(seed))
    assert resumed.version == straight.version == 3
    for k, v in leaves(straight.params()).items():
        np.testing.assert_array_equal(v, leaves(resumed.params())[k])


def test_rank_zero_is_full_fine_tuning():
    a, b = make_trainer(dataclasses.replace(CFG, lora=LoraConfig(rank=0))), make_trainer(CFG)
    assert not a.lora
    a.step(make_batch()), b.step(make_batch())
    for k, v in leaves(a.params()).items():
        np.testing.assert_array_equal(v, leaves(b.params())[k])


def test_the_push_is_the_adapter_alone():
    trainer = make_trainer(LORA)
    pushed = trainer.engine_params("float32")
    assert isinstance(pushed, LoraAdapter) and pushed.scale == 2.0 and pushed.rank == 4
    adapter_bytes = sum(x.nbytes for x in jax.tree.leaves(pushed))
    full_bytes = sum(x.nbytes for x in jax.tree.leaves(make_trainer().engine_params("float32")))
    assert adapter_bytes < 0.2 * full_bytes


def test_a_rank_above_a_targets_dimension_is_refused_naming_the_key():
    cfg = dataclasses.replace(CFG, lora=LoraConfig(rank=33, targets=("k_proj",)))  # k_proj: 64 -> 2 x 16
    with pytest.raises(ValueError, match=r"^trainer.lora.rank=33: larger than k_proj's smaller dimension \(32\)"):
        Trainer(Transformer(MODEL, rngs=nnx.Rngs(0)), cfg)


def test_bad_lora_keys_are_one_line_errors():
    with pytest.raises(ValueError, match=r"^trainer.lora.rank=-1:"):
        LoraConfig(rank=-1)
    with pytest.raises(ValueError, match=r"^trainer.lora.targets=\['qkv_proj'\]: .*'qkv_proj' matches no module"):
        LoraConfig(rank=2, targets=("qkv_proj",))


def test_a_checkpoint_holds_the_adapter_and_restores_it_exactly(tmp_path):
    from jaxrl_async.checkpoint import Checkpointer

    trainer = make_trainer(LORA)
    trainer.step(make_batch(0))
    checkpointer = Checkpointer(tmp_path, keep=2, every=1)
    checkpointer.save(1, trainer.state_dict(), {"step": 1})
    checkpointer.wait()
    fresh = make_trainer(LORA)
    state, meta = checkpointer.restore(fresh.state_dict())
    checkpointer.close()
    assert meta["trainer_version"] == 1
    fresh.load_state_dict(state)
    assert leaves(state["params"]).keys() == leaves(trainer.params()).keys()  # no base weight in it
    trainer.step(make_batch(1)), fresh.step(make_batch(1))
    for k, v in leaves(trainer.params()).items():
        np.testing.assert_array_equal(v, leaves(fresh.params())[k])


def test_a_sharded_lora_step_on_a_four_device_mesh_equals_the_unsharded_step():
    from jaxrl_async.sharding import make_mesh

    mesh = make_mesh(fsdp=2, tensor=2)
    sharded, plain = make_trainer(LORA, mesh=mesh), make_trainer(LORA)
    a = sharded.params(copy=False)["layers"]["w_up"]["a"]  # [L, E, r]: E over fsdp
    assert len(a.sharding.device_set) == 4 and not a.sharding.is_fully_replicated
    assert not sharded._frozen["layers"]["w_up"].sharding.is_fully_replicated  # the base is sharded too
    ms, mp = sharded.step(make_batch()), plain.step(make_batch())
    np.testing.assert_allclose(ms["grad_norm"], mp["grad_norm"], rtol=1e-4)
    for k, v in leaves(plain.params()).items():
        np.testing.assert_allclose(leaves(sharded.params())[k], v, atol=1e-5)
