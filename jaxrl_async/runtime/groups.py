"""The controller's table of groups: the candidate window and every admitted, untrained group.

It answers what the planner's driver contract asks of a uid (`planner.driver.DecisionHost.held`)
in the planner's one vocabulary, `planner.types.GroupState`:

    window entry (drawn from the stream, not admitted)  CANDIDATE
    live group generating, or being scored               RUNNING
    live group scored: may be trained                    DONE
    live group whose request was lost                    LOST  (until the policy re-admits or drops it)

Being scored is a refinement of RUNNING that only the runtime sees: `LiveGroup.scoring`. The
policy sees a group in flight until `on_group_finished`, and its rewards arrive after its last
token, so scoring is RUNNING's last part, not a state of its own. A flag, not a second enum,
keeps every comparison the controller makes with the planner's states in the planner's words;
the flag is read where the difference matters: a scoring group has no engine request left (no
abort, no stall, nothing to regenerate), and the checkpoint names it.

The checkpoint (runtime/state.py) keeps the phase strings it has always held, `phase_name`:
"generating" (RUNNING and LOST), "scoring" and "done". On restore a group that was not done has
lost its engine request: it comes back RUNNING and listed in `lost_on_resume`, for the planner's
fault path once the run starts. The table knows nothing of the engine, the ledger or the policy;
the controller calls them around it.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from dataclasses import dataclass

from jaxrl_async.runtime.rollouts import GroupRollout
from jaxrl_async.runtime.state import ControllerSnapshot, SavedGroup
from jaxrl_async.tasks.base import Prompt
from planner.types import Candidate, GroupState

GENERATING, SCORING, DONE = "generating", "scoring", "done"  # the checkpoint's phase strings


@dataclass
class LiveGroup:
    """An admitted, untrained group: its prompt and its current attempt's samples."""

    prompt: Prompt
    rollout: GroupRollout
    state: GroupState = GroupState.RUNNING  # RUNNING, DONE or LOST
    scoring: bool = False  # RUNNING's last part: all samples generated, the rewards being computed

    @property
    def generating(self) -> bool:
        """Its request is at the engine: pieces may still arrive, it can stall or be lost."""
        return self.state == GroupState.RUNNING and not self.scoring

    @property
    def phase_name(self) -> str:
        """The checkpoint's word for the group (a LOST group was generating)."""
        if self.state == GroupState.DONE:
            return DONE
        return SCORING if self.scoring else GENERATING


def candidate(uid: int, prompt: Prompt) -> Candidate:
    return Candidate(uid, prompt.prompt_id, len(prompt.prompt_ids))


class GroupTable:
    """Candidates (stream order, `size` of them once refilled) and live groups by uid."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.window: list[tuple[Candidate, Prompt]] = []  # stream order
        self.groups: dict[int, LiveGroup] = {}
        self.next_uid = 0  # uids stay unique across segments (the checkpoint keeps it)
        self.lost_on_resume: list[int] = []  # restored groups that were not done, for the fault path

    def refill(self, stream: Iterator[Prompt]) -> None:
        """Draw prompts from the stream until the window holds `size` candidates."""
        while len(self.window) < self.size:
            prompt = next(stream)
            self.window.append((candidate(self.next_uid, prompt), prompt))
            self.next_uid += 1

    def candidates(self) -> list[Candidate]:
        return [c for c, _ in self.window]

    def take_candidate(self, uid: int) -> Prompt:
        """Remove candidate `uid` from the window (it is being admitted); its prompt."""
        index = next(i for i, (c, _) in enumerate(self.window) if c.uid == uid)
        return self.window.pop(index)[1]

    def state(self, uid: int) -> GroupState | None:
        """`DecisionHost.held`: what the table holds of `uid`; None: nothing (trained, dropped, unknown)."""
        live = self.groups.get(uid)
        if live is None:
            return GroupState.CANDIDATE if any(c.uid == uid for c, _ in self.window) else None
        return live.state

    def lose(self, uid: int) -> None:
        """Group `uid`'s request is lost: it waits for the policy's re-admission or drop."""
        self.groups[uid].state = GroupState.LOST

    def is_lost(self, uid: int) -> bool:
        return self.state(uid) == GroupState.LOST

    def generating(self) -> dict[int, LiveGroup]:
        """The groups whose request is at the engine, by uid."""
        return {uid: g for uid, g in self.groups.items() if g.generating}

    def in_flight(self) -> int:
        """Admitted groups not done yet (generating, scoring or lost)."""
        return sum(g.state != GroupState.DONE for g in self.groups.values())

    def done(self) -> int:
        return sum(g.state == GroupState.DONE for g in self.groups.values())

    def failed_rewards(self) -> list[LiveGroup]:
        """Done groups whose rewards failed (a checkpoint's: they are scored again before any batch)."""
        return [g for g in self.groups.values() if g.state == GroupState.DONE and g.rollout.reward_errors]

    def deadlock(self, policy: str, step: int) -> RuntimeError:
        """The error of a run whose trainer waits for `step` with nothing in flight."""
        return RuntimeError(f"policy {policy}: the trainer waits for step {step} but nothing is generating or being "
                            f"scored ({self.done()} done groups, {len(self.window)} candidates refused): deadlock")

    # ================================================================== checkpoints
    def saved_window(self) -> tuple[tuple[int, Prompt], ...]:
        return tuple((c.uid, p) for c, p in self.window)

    def saved_groups(self) -> tuple[SavedGroup, ...]:
        """The live groups as the checkpoint keeps them, copied (the run goes on changing them)."""
        return tuple(SavedGroup(g.prompt, g.phase_name, copy.deepcopy(g.rollout)) for g in self.groups.values())

    def restore(self, snap: ControllerSnapshot) -> None:
        """The window and groups of `snap`, copied; the groups that were not done go to `lost_on_resume`."""
        self.next_uid = snap.next_uid
        self.window = [(candidate(uid, prompt), prompt) for uid, prompt in snap.window]
        self.groups = {}
        self.lost_on_resume = []
        for g in snap.groups:
            rollout = copy.deepcopy(g.rollout)
            done = g.phase == DONE
            self.groups[rollout.uid] = LiveGroup(g.prompt, rollout, GroupState.DONE if done else GroupState.RUNNING)
            if not done:
                self.lost_on_resume.append(rollout.uid)
