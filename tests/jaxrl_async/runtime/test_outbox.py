"""The engine outbox (runtime/outbox.py): engine calls leave in order, and no request reaches the
engine on weights older than its start barrier (docs/design.md §2.9)."""

import asyncio

import pytest

from jaxrl_async.engines.base import GenerationRequest, SamplingParams
from jaxrl_async.runtime.outbox import Abort, EngineOutbox, MarkCritical, Migrate, StartBarrierError, Submit


class RecordingEngine:
    """The two engine calls the outbox makes, in the order they arrive."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []

    async def submit(self, request: GenerationRequest) -> None:
        self.calls.append(("submit", request.request_id))

    async def abort(self, request_id: str) -> None:
        self.calls.append(("abort", request_id))

    async def mark_critical(self, request_id: str) -> None:
        self.calls.append(("critical", request_id))

    async def migrate(self, request_id: str):
        self.calls.append(("migrate", request_id))
        return (0, 1) if request_id.startswith("5.") else None  # group 5 moves, others stay


def request(rid: str) -> GenerationRequest:
    return GenerationRequest(rid, [1, 2], SamplingParams(max_new_tokens=4), 1.0)


def outbox(synced: int = 0):
    engine, submitted = RecordingEngine(), []
    return EngineOutbox(engine, synced=synced, on_submitted=submitted.append), engine, submitted


def test_commands_are_sent_in_the_order_the_decision_queued_them_and_only_at_flush():
    box, engine, submitted = outbox()
    box.abort("3.0")
    box.submit(request("3.1"), barrier=0)
    box.submit(request("4.0"), barrier=0)
    assert engine.calls == [] and box.commands == (Abort("3.0"), Submit(request("3.1"), 0), Submit(request("4.0"), 0))
    asyncio.run(box.flush())
    assert engine.calls == [("abort", "3.0"), ("submit", "3.1"), ("submit", "4.0")]
    assert submitted == ["3.1", "4.0"] and box.commands == ()  # the stall watch hears of submissions only
    asyncio.run(box.flush())
    assert len(engine.calls) == 3  # sent once


def test_a_request_whose_barrier_is_above_the_engines_weights_is_held_until_the_engine_holds_them():
    box, engine, _ = outbox(synced=1)
    box.submit(request("7.1"), barrier=3)
    box.submit(request("8.1"), barrier=2)
    box.submit(request("9.0"), barrier=1)  # met: the barrier equals the engine's version
    asyncio.run(box.flush())
    assert engine.calls == [("submit", "9.0")] and [c.request.request_id for c in box.held] == ["7.1", "8.1"]
    box.synced_to(2, still_wanted=lambda rid: True)
    asyncio.run(box.flush())
    assert engine.calls[1:] == [("submit", "8.1")] and [c.barrier for c in box.held] == [3]
    box.synced_to(3, still_wanted=lambda rid: True)
    box.synced_to(3, still_wanted=lambda rid: True)  # released once
    asyncio.run(box.flush())
    assert engine.calls[2:] == [("submit", "7.1")] and box.held == () and box.synced == 3


def test_a_held_request_no_longer_wanted_is_never_sent_and_leaves_the_hold():
    box, engine, _ = outbox()
    box.submit(request("1.1"), barrier=1)
    box.submit(request("2.1"), barrier=1)
    box.synced_to(1, still_wanted=lambda rid: rid != "1.1")  # group 1 was dropped meanwhile
    asyncio.run(box.flush())
    assert engine.calls == [("submit", "2.1")] and box.held == ()


def test_a_submission_below_its_barrier_that_reaches_flush_is_refused_before_the_engine_sees_it():
    box, engine, _ = outbox(synced=2)
    box.submit(request("5.0"), barrier=2)
    box.synced = 1  # whatever lowered it, the engine would now start the group on older weights
    with pytest.raises(StartBarrierError, match=r"request 5\.0: start barrier v2 but the engine holds v1"):
        asyncio.run(box.flush())
    assert engine.calls == []


def test_critical_marks_and_migrations_go_in_order_and_only_a_move_the_engine_made_is_reported():
    engine, moves = RecordingEngine(), []
    box = EngineOutbox(engine, on_migrated=lambda uid, src, dst: moves.append((uid, src, dst)))
    box.mark_critical("5.0")
    box.migrate(5, "5.0")
    box.migrate(6, "6.0")  # the engine finds no less loaded replica
    assert box.commands == (MarkCritical("5.0"), Migrate(5, "5.0"), Migrate(6, "6.0"))
    asyncio.run(box.flush())
    assert engine.calls == [("critical", "5.0"), ("migrate", "5.0"), ("migrate", "6.0")]
    assert moves == [(5, 0, 1)]
