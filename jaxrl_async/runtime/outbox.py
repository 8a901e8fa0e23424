"""The engine calls a decision causes, and the start barriers that hold a request back.

The controller applies a policy's decision under its lock without yielding half-way
(docs/design.md §5.2), so the engine calls the decision causes are queued here, one typed
command per call, and sent in order by `flush` once the decision is applied.

Start barriers (docs/design.md §2.9, §5.3): a (re-)admission carries `Admission.version`, the
oldest weights its group may start or resume on. The engine holds only published versions and
never goes back, so a request is safe to send once the engine's synced version meets its barrier.
`submit` queues a request whose barrier is met and holds the others; `synced_to` releases the
held ones whose barrier the new version meets. `flush` checks every submission against the
synced version once more, so a request can never reach the engine on older weights, whatever
queued it.

The tail's calls (`Decision.critical`, `Decision.migrate`, runtime/tail.py) go the same way:
`MarkCritical` and `Migrate`; a migration the engine made is reported to `on_migrated(uid, from,
to)` when its call returns.

To add an engine call: a frozen dataclass here, a branch in `_send`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from jaxrl_async.engines.base import GenerationEngine, GenerationRequest


@dataclass(frozen=True)
class Submit:
    """Send `request` to the engine; `barrier`: the oldest weights it may start on."""

    request: GenerationRequest
    barrier: int


@dataclass(frozen=True)
class Abort:
    """Stop generating `request_id` (dropped, or superseded by a re-admission)."""

    request_id: str


@dataclass(frozen=True)
class MarkCritical:
    """The planner marks `request_id` deadline-critical (the engine may speculate it)."""

    request_id: str


@dataclass(frozen=True)
class Migrate:
    """Move group `uid`'s request `request_id`, prefix kept, to a less loaded replica."""

    uid: int
    request_id: str


EngineCommand = Submit | Abort | MarkCritical | Migrate


class StartBarrierError(RuntimeError):
    """A submission reached the engine's outbox below its start barrier: a bug, never a user error."""


class EngineOutbox:
    """The queued engine calls of the decision being applied, and the requests held at their barrier.

    `synced`: the newest version the engine holds (the controller's `version`). `on_submitted`
    is called with each request id right after the engine accepted it (the stall watch's clock).
    """

    def __init__(self, engine: GenerationEngine, *, synced: int = 0,
                 on_submitted: Callable[[str], None] = lambda request_id: None,
                 on_migrated: Callable[[int, int, int], None] = lambda uid, src, dst: None) -> None:
        self.engine = engine
        self.synced = synced
        self.on_submitted = on_submitted
        self.on_migrated = on_migrated
        self._commands: list[EngineCommand] = []
        self._held: list[Submit] = []  # in admission order, until the engine holds their barrier

    @property
    def commands(self) -> tuple[EngineCommand, ...]:
        """What the next `flush` sends, in order."""
        return tuple(self._commands)

    @property
    def held(self) -> tuple[Submit, ...]:
        return tuple(self._held)

    def submit(self, request: GenerationRequest, barrier: int) -> None:
        """Queue `request`, or hold it while the engine's weights are older than `barrier`."""
        command = Submit(request, barrier)
        if barrier > self.synced:
            self._held.append(command)
        else:
            self._commands.append(command)

    def abort(self, request_id: str) -> None:
        self._commands.append(Abort(request_id))

    def mark_critical(self, request_id: str) -> None:
        self._commands.append(MarkCritical(request_id))

    def migrate(self, uid: int, request_id: str) -> None:
        self._commands.append(Migrate(uid, request_id))

    def synced_to(self, version: int, *, still_wanted: Callable[[str], bool]) -> None:
        """The engine now holds `version`: queue the held requests whose barrier it meets and that
        `still_wanted(request_id)` (a group dropped or superseded meanwhile is not sent)."""
        self.synced = version
        ready = [c for c in self._held if c.barrier <= version]
        self._held = [c for c in self._held if c.barrier > version]
        self._commands += [c for c in ready if still_wanted(c.request.request_id)]

    async def flush(self) -> None:
        """Send the queued commands in order."""
        commands, self._commands = self._commands, []
        for command in commands:
            await self._send(command)

    async def _send(self, command: EngineCommand) -> None:
        if isinstance(command, Submit):
            if command.barrier > self.synced:
                raise StartBarrierError(f"request {command.request.request_id}: start barrier v{command.barrier} "
                                        f"but the engine holds v{self.synced}")
            await self.engine.submit(command.request)
            self.on_submitted(command.request.request_id)
        elif isinstance(command, Abort):
            await self.engine.abort(command.request_id)
        elif isinstance(command, MarkCritical):
            await self.engine.mark_critical(command.request_id)
        else:
            moved = await self.engine.migrate(command.request_id)
            if moved is not None:
                self.on_migrated(command.uid, *moved)
