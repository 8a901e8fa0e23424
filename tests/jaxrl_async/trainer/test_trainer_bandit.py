"""End to end on a toy task: a tiny random Transformer learns a one-token bandit with GRPO.

Prompt = one fixed token; the policy samples one token; reward = 1 if it is in a target set
holding 1/8 of the vocabulary. A uniform policy scores 0.125; the trained one must score well
above it. Sampling is a jitted, uncached forward pass with the behaviour log-probs recorded,
exactly what an engine hands the trainer.
"""

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxrl_async.models.config import ModelConfig
from jaxrl_async.models.transformer import Transformer
from jaxrl_async.trainer.batch import pad_batch
from jaxrl_async.trainer.config import TrainerConfig
from jaxrl_async.trainer.optim import OptimConfig
from jaxrl_async.trainer.trainer import Trainer

PROMPT_TOKEN, GROUPS, GROUP_SIZE, STEPS = 7, 8, 8, 60


@partial(jax.jit, static_argnames=("graphdef", "n"))
def sample_first_token(graphdef, params, key, n):
    """n samples of the token after the prompt, with their log-probs under the sampling policy."""
    model = nnx.merge(graphdef, params)
    tokens = jnp.full((n, 1), PROMPT_TOKEN, jnp.int32)
    logits = model(tokens, jnp.zeros_like(tokens))
    logp = jax.nn.log_softmax(logits[:, -1])  # [n, V]
    sampled = jax.random.categorical(key, logp)  # [n]
    return sampled, jnp.take_along_axis(logp, sampled[:, None], axis=-1)[:, 0]


@pytest.mark.slow
def test_reward_rises_on_a_one_token_bandit():
    model_cfg = ModelConfig.tiny()
    target = np.arange(model_cfg.vocab_size) % 8 == 0
    trainer = Trainer(Transformer(model_cfg, rngs=nnx.Rngs(0)),
                      TrainerConfig(optim=OptimConfig(lr=3e-3, total_steps=STEPS, weight_decay=0.0)))
    key = jax.random.key(0)
    rewards_seen = []
    for step in range(STEPS):
        key, sub = jax.random.split(key)
        tokens, logprobs = jax.device_get(
            sample_first_token(trainer.graphdef, trainer.params(copy=False), sub, GROUPS * GROUP_SIZE))
        rewards = target[tokens].astype(np.float32)
        rewards_seen.append(rewards.mean())
        samples = [([PROMPT_TOKEN], [int(t)], [float(lp)], float(r), i // GROUP_SIZE)
                   for i, (t, lp, r) in enumerate(zip(tokens, logprobs, rewards))]
        metrics = trainer.step(pad_batch(samples, buckets=[2]))
        assert metrics["skipped"] == 0
        # Behaviour = the pre-step policy here, so the TIS weight is 1 up to roundoff.
        assert metrics["is_weight_mean"] == pytest.approx(1.0, abs=1e-3)
    assert trainer.version == STEPS
    early, late = np.mean(rewards_seen[:5]), np.mean(rewards_seen[-5:])
    assert early < 0.3, rewards_seen[:5]
    assert late > 0.8, rewards_seen[-5:]
