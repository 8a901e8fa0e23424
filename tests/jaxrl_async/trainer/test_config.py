"""Trainer configs: the Hydra group files and unknown keys.

That conf/trainer/grpo.yaml is exactly TrainerConfig's defaults is tests/jaxrl_async/cli/test_config_nodes.py's."""

import pytest

from jaxrl_async.cli.config_nodes import register_config_nodes
from jaxrl_async.trainer.config import TrainerConfig
from planner.configs import build
from tests.helpers.conf_files import composed, options


def load(name):
    register_config_nodes()
    return build(TrainerConfig, composed("trainer", name), "trainer")


@pytest.mark.parametrize("name", options("trainer"))
def test_every_trainer_yaml_builds_a_valid_config(name):
    assert isinstance(load(name), TrainerConfig)


def test_variants_differ_where_their_papers_do():
    assert load("dapo").loss.aggregation == "token_mean" and load("dapo").loss.eps_high == 0.28
    drgrpo = load("drgrpo").loss
    assert (drgrpo.advantage, drgrpo.aggregation) == ("drgrpo", "drgrpo") and drgrpo.norm_len > 0
    cispo, m2po = load("cispo").loss, load("m2po").loss
    assert (cispo.off_policy, cispo.cispo_eps_low, cispo.aggregation) == ("cispo", None, "token_mean")
    assert (m2po.off_policy, m2po.m2_threshold, m2po.aggregation) == ("m2po", 0.04, "token_mean")


def test_unknown_keys_are_refused_with_the_known_ones():
    with pytest.raises(ValueError, match=r"trainer.optim.learning_rate: unknown key \(known: b1, b2, eps, lr,"):
        build(TrainerConfig, {"optim": {"learning_rate": 1e-3}}, "trainer")
    with pytest.raises(ValueError, match=r"trainer.micro_batches: unknown key \(known: compute_dtype, logits_chunk, lora, loss,"):
        build(TrainerConfig, {"micro_batches": 2}, "trainer")
    with pytest.raises(ValueError, match="TrainerConfig.compute_dtype='float16'"):
        TrainerConfig(compute_dtype="float16")


def test_logits_chunk_is_off_by_default_and_takes_tokens_per_chunk():
    assert TrainerConfig().logits_chunk == 0 and load("grpo").logits_chunk == 0
    assert build(TrainerConfig, {"logits_chunk": 256}, "trainer").logits_chunk == 256


@pytest.mark.parametrize("value", [-1, 1.5, True, "64"])
def test_a_bad_logits_chunk_is_refused_naming_the_key(value):
    with pytest.raises(ValueError, match=r"^trainer\.logits_chunk=.*: must be an int >= 0"):
        TrainerConfig(logits_chunk=value)
