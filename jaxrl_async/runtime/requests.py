"""A group's engine request: its sampling limits, its seed and its priority.

One attempt of one admitted group is one `GenerationRequest` of `group_size` samples under the
id `"<uid>.<attempt>"` (rollouts.py), so a regenerated group is a new request. Its sampling
seed is crc32(seed:uid:attempt): reproducible, and no RNG state to checkpoint. Its length limit
and stop tokens are the task's (`task.lengths`, tasks/lengths.py: the model's own, or heavy-tailed
per-prompt lengths); its priority is the planner's (`Admission.priority`: the group's deadline,
docs/design.md §2.6).
"""

from __future__ import annotations

import zlib

from jaxrl_async.engines.base import GenerationRequest, SamplingParams
from jaxrl_async.runtime.config import RunConfig
from jaxrl_async.runtime.rollouts import GroupRollout
from jaxrl_async.tasks.base import Prompt, TaskConfig
from jaxrl_async.tasks.lengths import sampling_limits


def sampling_seed(seed: int, uid: int, attempt: int) -> int:
    """Sampling seed of one attempt of one group: reproducible, and no RNG state to checkpoint."""
    return zlib.crc32(f"{seed}:{uid}:{attempt}".encode())


def group_request(cfg: RunConfig, task: TaskConfig, prompt: Prompt, rollout: GroupRollout,
                  stop_token_ids: tuple[int, ...], priority: float, *, episodes: bool = False) -> GenerationRequest:
    """The request of `rollout` (the attempt just opened for `prompt`) under the run's sampling keys;
    `episodes`: each sample is an episode of a multi-turn task, played by the EpisodeEngine
    (envs/engine.py), which reads the prompt from the request."""
    max_new, stops = sampling_limits(task.lengths, task.length_scale, task.length_alpha, prompt.prompt_id,
                                     cfg.max_new_tokens, stop_token_ids)
    sampling = SamplingParams(
        max_new_tokens=max_new, temperature=cfg.temperature, top_p=cfg.top_p, stop_token_ids=stops,
        n=len(rollout.samples), seed=sampling_seed(cfg.seed, rollout.uid, rollout.attempt))
    return GenerationRequest(rollout.request_id, list(prompt.prompt_ids), sampling, priority,
                             episode_of=prompt if episodes else None)
