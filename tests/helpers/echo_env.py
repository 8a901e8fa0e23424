"""A small multi-turn task for the episode machinery's tests: `echo_turns`.

The environment answers every model turn with "turn <k>" (a `tool` message) until `max_turns`;
the reward is the share of turns the model took. `fault` makes a chosen step misbehave the way an
environment can: raise, hang, return something that is not a reply, or a reply too long for the
context. It is not registered in `TASKS` (the package's registry lists the package's tasks, which
the conf files and `--help` mirror): `echo_task(...)` builds one.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

from jaxrl_async.envs.episode import EpisodeResult
from jaxrl_async.envs.task import ChatEnvTask, EnvReply, EnvTaskConfig
from jaxrl_async.tasks.base import Example
from planner.configs import build


@dataclass(frozen=True, kw_only=True)
class EchoTurnsConfig(EnvTaskConfig):
    """`task=echo_turns` (tests).

    Attributes:
      num_prompts: prompts in the dataset.
      fault: "" (none) | raise | hang | bad | long | sync_hang: what step `fault_at_turn` does.
      fault_at_turn: the step (0 = after the first model turn) that misbehaves.
    """

    num_prompts: int = 8
    fault: str = ""
    fault_at_turn: int = 0


class EchoTurnsTask(ChatEnvTask):
    name = "echo_turns"
    config_class = EchoTurnsConfig
    cfg: EchoTurnsConfig

    def examples(self) -> list[Example]:
        return [Example(f"echo-{i}", f"Say something number {i}.", i, {"i": i}) for i in range(self.cfg.num_prompts)]

    def test_examples(self) -> list[Example]:
        return self.examples()[:2]

    def reset(self, prompt: Any) -> dict[str, int]:
        return {"steps": 0}

    async def step(self, state: dict[str, int], messages: list[dict[str, Any]]) -> Any:
        k = state["steps"]
        state["steps"] += 1
        if self.cfg.fault and k == self.cfg.fault_at_turn:
            if self.cfg.fault == "raise":
                raise RuntimeError("the tool broke")
            if self.cfg.fault == "hang":
                await asyncio.sleep(3600)
            if self.cfg.fault == "bad":
                return {"not": "a reply"}
            if self.cfg.fault == "long":
                return EnvReply([{"role": "tool", "content": "x" * 10_000}])
        return EnvReply([{"role": "tool", "content": f"turn {k}"}])

    def score_episode(self, state: dict[str, int], messages: list[dict[str, Any]]) -> EpisodeResult:
        turns = sum(m["role"] == "assistant" for m in messages)
        return EpisodeResult(turns / self.cfg.max_turns, {"turns": turns}, messages)


class SyncHangTask(EchoTurnsTask):
    """A plain (sync) step that blocks: it runs in a worker thread, so the run goes on."""

    name = "echo_turns_sync_hang"

    def step(self, state: dict[str, int], messages: list[dict[str, Any]]) -> Any:  # type: ignore[override]
        time.sleep(30)
        return EnvReply([{"role": "tool", "content": "late"}])


def echo_task(sync_hang: bool = False, **keys: Any) -> EchoTurnsTask:
    """An `echo_turns` task (a `SyncHangTask` with `sync_hang`) with these config keys, typed as any task's."""
    cls = SyncHangTask if sync_hang else EchoTurnsTask
    return cls(build(EchoTurnsConfig, keys, "task", what=f"key for task {cls.name!r}"))
