"""The tail's two decisions in the training runtime: critical marks and straggler migrations.

The planner's driver hands the controller `Decision.critical` and `Decision.migrate`
(`DecisionHost.mark_critical` / `migrate_groups`, planner/driver.py). `TailHooks` turns them into
engine calls queued on the outbox (runtime/outbox.py), each for the group's current request:

- a critical mark becomes `engine.mark_critical(request_id)` (an engine with
  `engine.speculation.when=critical` speculates the request's samples);
- a migration becomes `engine.migrate(request_id)`; when the engine moved it, the ledger gets a
  `migrate` line (`LedgerWriter.migrate`) with the tokens collected for the group so far, by
  version, and `groups_migrated` counts it. The engine streams every token it sampled before the
  move, so the collected tokens are a prefix of what the group trains: the audit's rule that the
  trained versions contain the line's versions holds, however many pieces are still on the way.

A uid whose group no longer generates (it finished or was lost between the decision and now) is
skipped: aborts and moves race with completion, as everywhere in the engine contract.
"""

from __future__ import annotations

from collections.abc import Callable

from jaxrl_async.runtime.groups import GroupTable
from jaxrl_async.runtime.metrics import RunStats
from jaxrl_async.runtime.outbox import EngineOutbox
from planner.ledger import LedgerWriter


class TailHooks:
    """`mark_critical` / `migrate_groups` of the controller, and the ledger line of each move."""

    def __init__(self, table: GroupTable, outbox: EngineOutbox, ledger: LedgerWriter,
                 stats: Callable[[], RunStats]) -> None:
        self.table = table
        self.ledger = ledger
        self.stats = stats  # the controller's current RunStats (it replaces the object on resume)
        self.outbox = outbox
        outbox.on_migrated = self.migrated

    def _requests(self, uids: list[int]) -> list[tuple[int, str]]:
        """(uid, request id) of the uids whose group is generating now."""
        live = self.table.generating()
        return [(uid, live[uid].rollout.request_id) for uid in uids if uid in live]

    def mark_critical(self, uids: list[int]) -> None:
        for _, request_id in self._requests(uids):
            self.outbox.mark_critical(request_id)

    def migrate_groups(self, uids: list[int]) -> None:
        for uid, request_id in self._requests(uids):
            self.outbox.migrate(uid, request_id)

    def migrated(self, uid: int, src: int, dst: int) -> None:
        """The engine moved group `uid` from replica `src` to `dst`: the ledger line, the count."""
        live = self.table.groups.get(uid)
        versions = live.rollout.token_versions() if live is not None else []
        self.ledger.migrate(uid, src, dst, versions)
        self.stats().groups_migrated += 1
