"""The driver contract: how every driver applies a `Decision` (docs/design.md §8.6).

A *driver* advances time and feeds a policy (`planner.base.Policy`) its events: the simulator
(`planner.sim.simulator`), the runtime (`jaxrl_async.runtime.controller`) and the test drivers
(`tests/helpers/scripted.py`, `tests/helpers/adversarial.py`). What they must do alike lives here,
once, so they cannot drift apart.

A driver implements `DecisionHost` — one query, `held` (the `GroupState` of a uid), and six
synchronous hooks — and hands every `Decision` to `apply_decision`, which checks it and calls the
hooks in the documented order:

    moves     -> host.record_moves(moves)        the ledger's `move` lines
    drops     -> host.drop_group(drop)           a running group is aborted first
    critical  -> host.mark_critical(uids)        running groups; speculate them (engine permitting)
    migrate   -> host.migrate_groups(uids)       running groups; move each to a less loaded replica
    the batch -> host.train_batch(uids)          only from select_batch; every uid done
    admits    -> host.admit_group(admission)     in list order; a candidate or a lost group

A hook must not yield: a driver with asynchronous work (the runtime's engine calls) queues it in
the hook and sends it once `apply_decision` has returned, so a decision is applied whole. Checks
that depend on one driver's machinery (the simulator's "trainer busy") stay there.

What a driver also shares lives beside this module: token versions in `planner.versions` (the
engines use them too) and the run's files (`summary.json`, `metrics.jsonl`) in `planner.run_files`.

To add a driver: implement `DecisionHost`, pass every Decision to `apply_decision`, keep token
versions with `planner.versions`, and write `run_files.summary(...)` / `run_files.step_record(...)`
with your own extensions after the common keys.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from planner.types import Admission, Decision, Drop, GroupState, Move


# What a driver holds of a uid, as `apply_decision`'s checks read it (None: nothing, never offered
# or already trained or dropped; a driver reports an in-flight group as QUEUED or RUNNING).
UNTRAINED = frozenset({GroupState.QUEUED, GroupState.RUNNING, GroupState.LOST, GroupState.DONE})  # what a drop may name
ADMISSIBLE = frozenset({GroupState.CANDIDATE, GroupState.LOST})  # what an admission may name
TRAINABLE = frozenset({GroupState.DONE})  # what a batch may name
IN_FLIGHT = frozenset({GroupState.QUEUED, GroupState.RUNNING})  # what a critical mark or migration may name
_SAID = {None: "unknown", GroupState.CANDIDATE: "a candidate", GroupState.RUNNING: "generating"}  # error words


@runtime_checkable
class DecisionHost(Protocol):
    """What a driver implements so that `apply_decision` can apply a policy's decisions."""

    def held(self, uid: int) -> GroupState | None: ...

    def record_moves(self, moves: list[Move]) -> None: ...

    def drop_group(self, drop: Drop) -> None: ...

    def mark_critical(self, uids: list[int]) -> None: ...

    def migrate_groups(self, uids: list[int]) -> None: ...

    def train_batch(self, uids: list[int]) -> None: ...

    def admit_group(self, admission: Admission) -> None: ...


def apply_decision(host: DecisionHost, d: Decision, *, call: str, policy: str) -> None:
    """Apply `d`, returned by the policy's `call`, to `host` (docs/design.md §8.6): moves, drops,
    critical marks, migrations, the batch, then the admissions in list order. `policy` names the
    policy in error messages.

    Raises ValueError, before the offending item is applied, on a batch from any call but
    `select_batch`, a batch naming a uid twice or a group that is not done, a drop of a group that
    is not admitted and untrained, a critical mark or migration of a group that is not running
    (queued or generating; one already done is skipped, not an error), and an admission of a uid that is neither a candidate nor a lost
    group (an admission earlier in the same list counts: a uid admitted twice is an error).
    """
    if d.moves:
        host.record_moves(d.moves)
    for drop in d.drop:
        _require(host, drop.uid, UNTRAINED, f"policy {policy} dropped uid {drop.uid} in {call}",
                 "not an admitted, untrained group")
        host.drop_group(drop)
    for field, hook in (("critical", host.mark_critical), ("migrate", host.migrate_groups)):
        uids = getattr(d, field)
        if uids:
            # A group the driver already holds as done finished between the policy's view and the
            # driver's (one completion ends several groups, reported one by one; a group with
            # nothing to generate ends at its start): nothing is left to speed up, so it is skipped.
            uids = [uid for uid in uids if host.held(uid) != GroupState.DONE]
            for uid in uids:
                _require(host, uid, IN_FLIGHT, f"policy {policy} named uid {uid} in {field} in {call}",
                         "not a running group")
            if uids:
                hook(uids)
    if d.train is not None:
        if call != "select_batch":
            raise ValueError(f"policy {policy}: {call} returned a batch; only select_batch may")
        if len(set(d.train)) != len(d.train):
            raise ValueError(f"policy {policy}: batch {d.train} names a uid twice")
        for uid in d.train:
            _require(host, uid, TRAINABLE, f"policy {policy} trained uid {uid}", "not done")
        host.train_batch(d.train)
    for a in d.admit:
        _require(host, a.uid, ADMISSIBLE, f"policy {policy} admitted uid {a.uid} in {call}",
                 "neither a candidate nor a lost group")
        host.admit_group(a)


def _require(host: DecisionHost, uid: int, allowed: frozenset[GroupState], what: str, rule: str) -> None:
    state = host.held(uid)
    if state not in allowed:
        raise ValueError(f"{what}: it is {_SAID.get(state) or state.name.lower()}, {rule}")
