"""Per-prompt generation lengths: the task option that makes a run's lengths heavy-tailed.

`task.lengths` (every task):

- "model" (the default): every sample ends at a stop token of the model or at the run's
  `max_new_tokens`, as the model decides;
- "heavy_tail": each prompt gets its own `max_new_tokens`, drawn once per prompt id from the
  simulator's heavy-tail distribution (planner/sim/workloads.py `heavy_tail`: Pareto with minimum
  `task.length_scale` x max_new_tokens and tail index `task.length_alpha`, clipped to
  max_new_tokens), and stop tokens are ignored, so every sample runs to its prompt's length. A
  tiny model's lengths are then as heavy-tailed as an RL run's on a large one, which is what a
  real-run benchmark of tail scheduling needs (benchmarks/bench_tail_runtime.py).

The draw depends only on the prompt id (a CRC of it seeds the generator), so a prompt is as long
in every epoch, in every run and after a resume; "model" draws nothing.
"""

from __future__ import annotations

import zlib

import numpy as np

from planner.sim.workloads import HeavyTail, HeavyTailParams

LENGTHS = ("model", "heavy_tail")


def sampling_limits(lengths: str, scale: float, alpha: float, prompt_id: str, max_new_tokens: int,
                    stop_token_ids: tuple[int, ...]) -> tuple[int, tuple[int, ...]]:
    """(max_new_tokens, stop_token_ids) of one prompt's samples under `task.lengths`."""
    if lengths == "model":
        return max_new_tokens, stop_token_ids
    params = HeavyTailParams(scale=scale * max_new_tokens, alpha=alpha, prompt_sigma=0.0,
                             max_tokens=max_new_tokens, prompt_tokens=0)
    rng = np.random.default_rng(zlib.crc32(str(prompt_id).encode()))
    draws = HeavyTail(params, group_size=1).sample(rng, 1)
    return int(draws.lengths[0, 0]), ()
