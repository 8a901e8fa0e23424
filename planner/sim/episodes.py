"""Multi-turn episodes in the simulator: a group whose samples alternate engine turns and
environment steps (`workload=multi_turn`, docs/design.md §4).

A multi-turn group (a `SimGroup` with `episode` set) never runs on a worker itself. Each sample's
model turn is a *turn run*: a one-sample `SimGroup` (`turn_of` = (group, sample)) that a worker
queues, prefills (the episode's context so far: prompt, earlier turns and environment replies;
no prefix cache), decodes and books to weight versions like any group — so slots, KV, partial
rollout, speculation and migration act on it unchanged. Between two turns the sample is off the
engine, in its environment step, for the step's drawn latency: engine time cannot shorten it.
Its next turn is then queued with the start barrier max(group's admission version, the version of
its previous turn's last token), so it starts on the newest weights the engine holds at that time
and never on older ones than its previous turn's (the audit's per-sample rule, planner/ledger_audit.py).
A failed environment step ends the sample there; its tokens still train.

The group is QUEUED until its first turn of an attempt starts (`on_group_started`), RUNNING while
any sample is in a turn or an environment step, and DONE when every sample's last step ended
(`on_group_finished`, whose `last_versions` are each sample's last token's version). A fault
(or a drop) stops every turn of the group: with the prefix kept, an interrupted turn resumes where
it stopped and environment steps in flight still end (the environment is not the engine); without,
the episode starts over from its first turn (`attempt` voids the steps in flight).

`Episode` holds one group's samples; `EpisodeStats` counts what trained groups' episodes did, for
the summary's `episodes` key and its tail's generation / environment / waiting split
(planner/tail_analysis.py `episode_split`).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from planner.sim.config import SimConfig
from planner.sim.group import SimGroup
from planner.sim.workloads import EpisodeDraw
from planner.types import GroupState

READY, TURN, ENV, DONE = "ready", "turn", "env", "done"  # a sample's phase


class Sample:
    """One sample of a multi-turn group: its draw, its next turn and what its turns generated."""

    __slots__ = ("index", "draw", "turn", "phase", "run", "spans", "newest", "times", "queued_at", "started_at")

    def __init__(self, index: int, draw: EpisodeDraw) -> None:
        self.index = index
        self.draw = draw
        self.turn = 0  # the turn running or next to run
        self.phase = READY
        self.run: SimGroup | None = None  # its turn run while phase is TURN
        self.spans: list[dict[int, int]] = []  # version -> tokens of each finished turn
        self.newest = 0  # version of its last generated token (the next turn's start barrier)
        self.times: list[list[float]] = []  # [queued_s, gen_s, env_s] of each finished turn
        self.queued_at = 0.0
        self.started_at: float | None = None


class Episode:
    """The samples of one multi-turn group and the turn runs it hands the simulator."""

    __slots__ = ("group", "samples", "attempt")

    def __init__(self, group: SimGroup, draws: list[EpisodeDraw]) -> None:
        self.group = group
        self.samples = [Sample(i, d) for i, d in enumerate(draws)]
        self.attempt = 0  # bumps when the episode starts over or stops: environment steps in flight go void

    def restart(self) -> None:
        """Every sample from its first turn (a fault without the prefix kept)."""
        self.attempt += 1
        self.samples = [Sample(s.index, s.draw) for s in self.samples]

    # ------------------------------------------------------------------ turns
    def to_queue(self, now: float) -> list[SimGroup]:
        """The turn runs to queue now: interrupted turns (resumed where they stopped) and the next
        turn of every sample that waits for one."""
        out = []
        for s in self.samples:
            if s.phase == READY:
                s.run = self._turn_run(s)
                s.phase = TURN
                s.queued_at, s.started_at = now, None
                out.append(s.run)
            elif s.phase == TURN and s.run is not None and s.run.state == GroupState.LOST:
                s.run = self._resumed(s.run)
                out.append(s.run)
        return out

    def _resumed(self, stopped: SimGroup) -> SimGroup:
        """A stopped turn run's continuation, a new object with its progress and versions: the
        stopped one may still sit in a worker's queue, where its state (LOST) voids it."""
        g = self.group
        run = SimGroup(g.uid, g.prompt_id, stopped.prompt_tokens, stopped.lengths)
        run.done_tok, run.versions, run.last_versions = stopped.done_tok, stopped.versions, stopped.last_versions
        run.token = stopped.token  # not a first run: an empty remainder books no extra last version
        run.turn_of, run.priority, run.critical = stopped.turn_of, g.priority, g.critical
        # never resumed on weights older than those its tokens so far came from
        run.min_version = max(stopped.min_version, g.min_version, *stopped.versions)
        return run

    def _turn_run(self, s: Sample) -> SimGroup:
        g, d = self.group, s.draw
        context = g.prompt_tokens + sum(d.turns[:s.turn]) + s.turn * d.reply_tokens
        run = SimGroup(g.uid, g.prompt_id, context, [d.turns[s.turn]])
        run.turn_of = (g, s.index)
        run.priority = g.priority
        run.critical = g.critical
        run.min_version = max(g.min_version, s.newest)
        return run

    def runs(self) -> list[SimGroup]:
        """The turn runs queued or running now."""
        return [s.run for s in self.samples
                if s.phase == TURN and s.run is not None and s.run.state in (GroupState.QUEUED, GroupState.RUNNING)]

    def started(self, sample: int, now: float) -> None:
        s = self.samples[sample]
        if s.started_at is None:
            s.started_at = now

    def stopped(self, run: SimGroup) -> None:
        """`run` was taken off the engine (fault, drop): its tokens so far stay booked on it."""
        run.state = GroupState.LOST

    def turn_done(self, sample: int, now: float) -> float:
        """Sample `sample`'s turn ended: book its span; it enters the environment step after it,
        whose seconds are returned."""
        s = self.samples[sample]
        run = s.run
        span = dict(run.versions)
        s.spans.append(span)
        s.newest = max([s.newest, *(v for v, t in span.items() if t)])
        for v, t in span.items():
            self.group.versions[v] = self.group.versions.get(v, 0) + t
        started = s.started_at if s.started_at is not None else now
        env_s = s.draw.env_s[s.turn]
        s.times.append([started - s.queued_at, now - started, env_s])
        s.run, s.phase = None, ENV
        return env_s

    def env_done(self, sample: int) -> bool:
        """Sample `sample`'s environment step ended; True when it has another turn to run."""
        s = self.samples[sample]
        s.turn += 1
        s.phase = READY if s.turn < len(s.draw.turns) else DONE
        return s.phase == READY

    @property
    def done(self) -> bool:
        return all(s.phase == DONE for s in self.samples)

    # ------------------------------------------------------------------ what it generated
    def generated(self) -> int:
        """Tokens generated in this attempt: finished turns and the turns in flight."""
        return self.group.generated + sum(sum(s.run.versions.values()) for s in self.samples if s.run is not None)

    def versions_list(self) -> list[tuple[int, int]]:
        """The group's versions with the turns in flight: what a migration has moved so far."""
        total = dict(self.group.versions)
        for s in self.samples:
            if s.run is not None:
                for v, t in s.run.versions.items():
                    total[v] = total.get(v, 0) + t
        return sorted(total.items())

    def turns(self) -> list[tuple[int, list[tuple[int, int]]]]:
        """The ledger's `turns` spans: (sample, versions) per model turn, sample by sample, in turn order."""
        return [(s.index, sorted(span.items())) for s in self.samples for span in s.spans]

    def reply_tokens(self) -> int:
        """Environment reply tokens in the samples' sequences: one reply after each turn but the last."""
        return sum(s.draw.reply_tokens * max(0, len(s.spans) - 1) for s in self.samples)

    def last_versions(self) -> tuple[int, ...]:
        return tuple(s.newest for s in self.samples)


def idle_keys(cfg: SimConfig) -> list[str]:
    """A one-line warning for each `sim.*` key that cannot act on multi-turn turn runs."""
    out = []
    if cfg.faults.stall_prob:
        out.append(f"sim.faults.stall_prob={cfg.faults.stall_prob}: has no effect with workload=multi_turn "
                   "(its turn runs never hang; environment faults are workload.env_fail_p / env_timeout_s)")
    return out


class EpisodeStats:
    """What the trained multi-turn groups' episodes did: the summary's `episodes` key."""

    def __init__(self) -> None:
        self.episodes = 0
        self.turns = 0
        self.faults: Counter[str] = Counter()
        self.fault_tokens = 0  # tokens trained from episodes a failed environment step ended
        self.spanning = 0  # trained groups whose turns span two or more weight versions
        self.records: list[dict[str, Any]] = []  # `episode` trace lines' fields, for the tail split

    def trained(self, episode: Episode) -> None:
        self.spanning += len(episode.group.versions) > 1
        for s in episode.samples:
            self.episodes += 1
            self.turns += len(s.spans)
            if s.draw.fault is not None:
                self.faults[s.draw.fault] += 1
                self.fault_tokens += sum(sum(span.values()) for span in s.spans)
            self.records.append({"event": "episode", "uid": episode.group.uid, "sample": s.index,
                                 "turns": s.times, "fault": s.draw.fault})

    def summary(self) -> dict[str, Any]:
        return {"episodes": self.episodes, "turns": self.turns, "faults": dict(sorted(self.faults.items())),
                "fault_tokens_trained": self.fault_tokens, "groups_spanning_versions": self.spanning}
