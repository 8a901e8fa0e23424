"""The lockstep channel and roles, on a hand-written key-value store (one process).

The real store is jax.distributed's coordination service; tests/jaxrl_async/test_train_placement.py
runs the whole thing over two processes.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest

from jaxrl_async.cluster import lockstep
from jaxrl_async.cluster.lockstep import CommandChannel, follow, lead


class FakeStore:
    """The four calls the channel makes, over a dict; a missing key times out like the service."""

    def __init__(self, keep: bool = False) -> None:
        self.keep = keep  # keep deleted keys: a test reads the commands after they were all sent
        self.data: dict[str, bytes] = {}
        self.fail_with: str | None = None
        self.timeouts_left = 0

    def key_value_set_bytes(self, key: str, value: bytes) -> None:
        self.data[key] = value

    def key_value_set(self, key: str, value: str) -> None:
        self.data[key] = value.encode()

    def key_value_delete(self, key: str) -> None:
        if not self.keep:
            del self.data[key]

    def blocking_key_value_get_bytes(self, key: str, timeout_ms: int) -> bytes:
        if self.fail_with:
            raise RuntimeError(self.fail_with)
        if self.timeouts_left or key not in self.data:
            self.timeouts_left = max(0, self.timeouts_left - 1)
            raise RuntimeError(f"DEADLINE_EXCEEDED: GetKeyValue() timed out with key: {key}")
        return self.data[key]

    def blocking_key_value_get(self, key: str, timeout_ms: int) -> str:
        return self.blocking_key_value_get_bytes(key, timeout_ms).decode()


def test_commands_arrive_in_order_whole_and_the_store_keeps_only_the_last_two(monkeypatch):
    monkeypatch.setattr(lockstep, "CHUNK_BYTES", 1000)
    store = FakeStore()
    leader, follower = CommandChannel(store), CommandChannel(store)
    big = np.arange(2000, dtype=np.float32)  # 8 kB: several chunks
    sent = [("step", {"rows": big}), ("engine_params", "bfloat16"), ("save", (3, {"step": 3})), ("stop", None)]
    for kind, payload in sent:
        leader.send(kind, payload)
        got_kind, got = follower.receive()
        assert got_kind == kind
        if kind == "step":
            np.testing.assert_array_equal(got["rows"], big)
        else:
            assert got == payload
    assert {key.split("/")[-2] for key in store.data} == {"2", "3"}  # commands 0, 1 deleted


def test_a_follower_waits_through_timeouts_and_fails_in_one_line_when_the_service_is_gone(monkeypatch):
    store = FakeStore()
    CommandChannel(store).send("step", 1)
    store.timeouts_left = 2
    assert CommandChannel(store).receive() == ("step", 1)
    store.fail_with = "UNAVAILABLE: failed to connect to all addresses\nmore detail"
    with pytest.raises(RuntimeError, match=r"^lockstep: lost process 0 while waiting for command 0: "
                                           r"UNAVAILABLE: failed to connect to all addresses$"):
        CommandChannel(store).receive()


class Recorder:
    """A trainer and a checkpointer that log the calls the roles make."""

    def __init__(self, log: list) -> None:
        self.log = log

    def step(self, batch):
        self.log.append(("step", batch))
        return {"loss": 0.0}

    def engine_params(self, dtype):
        self.log.append(("engine_params", dtype))

    def host_params(self):
        self.log.append(("host_params",))

    def state_dict(self):
        return {"version": 7}

    def save(self, steps_done, state, meta):
        self.log.append(("save", steps_done, state["version"], meta))

    def lend(self, release):
        self.log.append(("lend", release.__name__))

    def wait_written(self):
        pass

    def close(self):
        self.log.append(("close",))


def test_the_leader_announces_each_collective_call_and_the_follower_makes_the_same_calls():
    store, leader_log, follower_log = FakeStore(keep=True), [], []
    channel = CommandChannel(store)
    trainer, checkpointer = lead(Recorder(leader_log), Recorder(leader_log), channel)
    trainer.step("batch-0")
    trainer.engine_params("bfloat16")
    trainer.step("batch-1")
    checkpointer.save(2, {"version": 2}, {"step": 2})
    trainer.host_params()
    checkpointer.close()
    channel.send("stop")
    # Every command is in the store before the leader's own call returns.
    assert len(leader_log) == 6
    steps = follow(Recorder(follower_log), Recorder(follower_log), CommandChannel(store))
    assert steps == 2
    assert follower_log == [("step", "batch-0"), ("engine_params", "bfloat16"), ("step", "batch-1"),
                            ("save", 2, 7, {"step": 2}), ("lend", "wait_written"), ("host_params",),
                            ("close",)]


def test_announce_and_call_are_atomic_across_threads():
    """The train thread's step and the event loop's push never interleave their two halves."""
    store, log = FakeStore(keep=True), []
    channel = CommandChannel(store)

    class Slow(Recorder):
        def step(self, batch):
            log.append(("begin", batch))
            threading.Event().wait(0.01)
            log.append(("end", batch))

        def engine_params(self, dtype):
            log.append(("begin", dtype))
            log.append(("end", dtype))

    trainer, _ = lead(Slow(log), Recorder(log), channel)
    threads = [threading.Thread(target=trainer.step, args=(f"b{i}",)) for i in range(4)]
    threads += [threading.Thread(target=trainer.engine_params, args=(f"d{i}",)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(log[i][0] == "begin" and log[i + 1] == ("end", log[i][1]) for i in range(0, len(log), 2))
    follower = CommandChannel(store)
    announced = [follower.receive()[1] for _ in range(8)]
    assert announced == [entry[1] for entry in log[::2]]  # commands in the order the calls ran
