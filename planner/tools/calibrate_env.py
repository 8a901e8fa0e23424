"""The environment terms of `planner.calibrate`: `workload=multi_turn` fitted from a real run's
multi-turn episodes (the trace's `episode` lines, planner/run_trace.py; docs/calibration.md).

    environment(episode_lines, finish_lines, admit_lines) -> {"workload": {...}, "fit": {...}} | None

In the workload's terms (planner/sim/workloads.py MultiTurnParams):

- turns_mean, max_turns: the mean and the most model turns of the episodes that ended on their
  own (an environment fault cuts an episode short: counting those would shorten every episode);
  every episode when all of them failed.
- turn_mu, turn_sigma: the log-mean and log-spread of each episode's tokens per turn — its
  sample's length (the group's `finish` line) over its turns. The trace holds no per-turn token
  count, so the spread is between episodes only (within one it is taken as none), and
  prompt_sigma is 0: the per-prompt factor is inside that spread.
- env_*: the environment steps' seconds (every turn's `env_s`). Above their 95th percentile u
  lies the tail: env_tail_p is the share there, env_tail_scale = u and env_tail_alpha the Hill
  estimate n / Σ ln(x/u) over the steps above it (needs two or more); below u, the log-normal body
  (env_mu, env_sigma). env_timeout_s: the median seconds of the steps a timeout ended, or null
  when none did. env_fail_p: the other faults per environment step.
- prompt_tokens: the median of the `admit` lines'. reply_tokens is not in the trace: the default.

Returns None for a trace without episode lines: the caller emits nothing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

TAIL_QUANTILE = 0.95  # environment steps above this quantile are fitted as the Pareto tail


def environment(episodes: Sequence[Mapping[str, Any]], finishes: Sequence[Mapping[str, Any]],
                admits: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """The fitted `workload=multi_turn` keys and the fit's counts; None without episode lines."""
    if not episodes:
        return None
    lengths = {e["uid"]: e["lengths"] for e in finishes}  # the last attempt's, as the episodes are
    turns = [len(e["turns"]) for e in episodes]
    ended = [n for n, e in zip(turns, episodes) if e["fault"] is None] or turns
    per_turn = [lengths[e["uid"]][e["sample"]] / len(e["turns"]) for e in episodes
                if e["turns"] and e["uid"] in lengths and e["sample"] < len(lengths[e["uid"]])]
    env = np.array([float(t[2]) for e in episodes for t in e["turns"]], float)
    timeouts = [float(e["turns"][-1][2]) for e in episodes if e["fault"] == "timeout" and e["turns"]]
    errors = sum(1 for e in episodes if e["fault"] is not None and e["fault"] != "timeout")
    keys: dict[str, Any] = {"name": "multi_turn", "max_turns": int(max(ended)),
                            "turns_mean": round(min(max(1.0, float(np.mean(ended))), max(ended)), 4)}
    if per_turn:
        logs = np.log(np.maximum(per_turn, 1.0))
        keys.update(turn_mu=round(float(logs.mean()), 4), turn_sigma=round(float(logs.std()), 4), prompt_sigma=0.0)
    keys.update(_latency(env[env > 0]))
    keys["env_timeout_s"] = round(float(np.median(timeouts)), 4) if timeouts else None
    keys["env_fail_p"] = round(errors / max(1, len(env)), 6)
    if admits:
        keys["prompt_tokens"] = int(np.median([a["prompt_tokens"] for a in admits]))
    tail_steps = int(round(keys.get("env_tail_p", 0.0) * int((env > 0).sum())))
    fit = {"episodes": len(episodes), "turns": int(sum(turns)), "env_steps": len(env), "tail_steps": tail_steps,
           "faults": {"timeout": len(timeouts), "other": errors}, "with_lengths": len(per_turn)}
    return {"workload": keys, "fit": fit}


def _latency(x: np.ndarray) -> dict[str, float]:
    """Log-normal body below the TAIL_QUANTILE, Pareto tail (Hill) above it; no tail from fewer
    than two steps above it."""
    if not len(x):
        return {"env_tail_p": 0.0}
    u = float(np.quantile(x, TAIL_QUANTILE))
    tail, body = x[x > u], x[x <= u]
    out: dict[str, float] = {}
    logs = np.log(body if len(body) else x)
    out["env_mu"], out["env_sigma"] = round(float(logs.mean()), 4), round(float(logs.std()), 4)
    spread = float(np.log(tail / u).sum()) if len(tail) >= 2 else 0.0
    if spread > 0:
        out.update(env_tail_p=round(len(tail) / len(x), 6), env_tail_scale=round(u, 4),
                   env_tail_alpha=round(len(tail) / spread, 4))
    else:
        out["env_tail_p"] = 0.0
    return out
