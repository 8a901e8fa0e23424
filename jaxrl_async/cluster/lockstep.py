"""One training job over several JAX processes: process 0 leads, the others follow in lockstep.

Multi-controller JAX runs a computation over a mesh that spans processes only when every process
issues it, in the same order. A run has one controller (planner, ledger, metrics, engines,
progress display), so it lives on process 0 alone; the other processes build the same trainer
and checkpointer and `follow` process 0's collective calls:

    process 0                                   process i > 0
    LeaderTrainer.step(batch)        ──step──►  trainer.step(batch)        (sharded train step)
    LeaderTrainer.engine_params(dt)  ──push──►  trainer.engine_params(dt)  (gather for the engines)
    LeaderTrainer.host_params()      ──host──►  trainer.host_params()      (final export)
    LeaderCheckpointer.save(k, s, m) ──save──►  checkpointer.save(k, ...)  (orbax, multi-process)
    LeaderCheckpointer.close()       ──close─►  checkpointer.close()
    CommandChannel.send("stop")      ──stop──►  return

Commands travel through the key-value store of `jax.distributed`'s coordination service, not
through device collectives: a follower may wait minutes while process 0 generates, and a
device-level broadcast would time out (gloo) or compile once per payload size. Each command is
announced under a sequence number, the payload split into chunks that fit a gRPC message.
Every command except `stop` runs a collective, so a follower that executed command s has read
command s - 1: the leader deletes the keys of s - 2 when it sends s, and the store stays small.

A follower whose leader died stops waiting when the coordination service (hosted by process 0)
goes away: it raises, the process exits non-zero, and the launcher ends the job (launch/launch.py).
"""

from __future__ import annotations

import logging
import pickle
import threading
import time
from typing import Any

log = logging.getLogger(__name__)

PREFIX = "jaxrl_async/lockstep"
CHUNK_BYTES = 1 << 20
# How long one blocking read waits before a follower logs that it is still waiting.
WAIT_LOG_S = 600


def _client():
    """The `jax.distributed` client of this process (its coordination-service connection)."""
    from jax._src import distributed

    client = distributed.global_state.client
    if client is None:
        raise RuntimeError("lockstep: jax.distributed is not initialized in this process")
    return client


class CommandChannel:
    """Process 0 → every other process: an ordered stream of (kind, payload) commands."""

    def __init__(self, client: Any = None, prefix: str = PREFIX) -> None:
        self._client = client if client is not None else _client()
        self._prefix = prefix
        self._seq = 0
        self._chunks: dict[int, int] = {}  # leader: seq -> chunks written, until deleted

    def _key(self, seq: int, part: str) -> str:
        return f"{self._prefix}/{seq}/{part}"

    def send(self, kind: str, payload: Any = None) -> None:
        data = pickle.dumps((kind, payload), protocol=pickle.HIGHEST_PROTOCOL)
        chunks = [data[i:i + CHUNK_BYTES] for i in range(0, len(data), CHUNK_BYTES)] or [b""]
        for i, chunk in enumerate(chunks):
            self._client.key_value_set_bytes(self._key(self._seq, str(i)), chunk)
        # The count goes last: a follower that sees it finds every chunk in place.
        self._client.key_value_set(self._key(self._seq, "chunks"), str(len(chunks)))
        self._chunks[self._seq] = len(chunks)
        old = self._seq - 2
        if old in self._chunks:
            for part in ["chunks", *map(str, range(self._chunks.pop(old)))]:
                self._client.key_value_delete(self._key(old, part))
        self._seq += 1

    def receive(self) -> tuple[str, Any]:
        waited = 0.0
        while True:
            try:
                count = int(self._client.blocking_key_value_get(self._key(self._seq, "chunks"), WAIT_LOG_S * 1000))
                break
            except Exception as error:  # noqa: BLE001 - a timeout is retried, a lost service is fatal
                if "DEADLINE_EXCEEDED" not in str(error) and "timed out" not in str(error).lower():
                    raise RuntimeError(f"lockstep: lost process 0 while waiting for command {self._seq}: "
                                       f"{str(error).splitlines()[0]}") from error
                waited += WAIT_LOG_S
                log.info("lockstep: waited %.0f s for command %d from process 0", waited, self._seq)
        data = b"".join(self._client.blocking_key_value_get_bytes(self._key(self._seq, str(i)), 60_000)
                        for i in range(count))
        self._seq += 1
        return pickle.loads(data)


class LeaderTrainer:
    """Process 0's view of the `Trainer`: a call that runs a collective first announces itself,
    so the followers make the same call. Everything else passes through."""

    def __init__(self, trainer: Any, channel: CommandChannel, lock: threading.Lock) -> None:
        self._trainer, self._channel, self._lock = trainer, channel, lock

    def __getattr__(self, name: str) -> Any:
        return getattr(self._trainer, name)

    def step(self, batch: Any) -> dict[str, float]:
        with self._lock:  # announce-and-run is atomic: commands and collectives keep one order
            self._channel.send("step", batch)
            return self._trainer.step(batch)

    def engine_params(self, dtype: str) -> Any:
        with self._lock:
            self._channel.send("engine_params", dtype)
            return self._trainer.engine_params(dtype)

    def host_params(self) -> Any:
        with self._lock:
            self._channel.send("host_params")
            return self._trainer.host_params()


class LeaderCheckpointer:
    """Process 0's `Checkpointer`: saves and the final close are collective in orbax."""

    def __init__(self, checkpointer: Any, channel: CommandChannel, lock: threading.Lock) -> None:
        self._checkpointer, self._channel, self._lock = checkpointer, channel, lock

    def __getattr__(self, name: str) -> Any:
        return getattr(self._checkpointer, name)

    def save(self, steps_done: int, trainer_state: dict[str, Any], meta: dict[str, Any]) -> None:
        with self._lock:
            self._channel.send("save", (steps_done, meta))
            self._checkpointer.save(steps_done, trainer_state, meta)

    def close(self) -> None:
        with self._lock:
            self._channel.send("close")
            self._checkpointer.close()


def lead(trainer: Any, checkpointer: Any, channel: CommandChannel) -> tuple[LeaderTrainer, LeaderCheckpointer]:
    """Process 0's trainer and checkpointer, sharing one lock so their commands never interleave."""
    lock = threading.Lock()
    return LeaderTrainer(trainer, channel, lock), LeaderCheckpointer(checkpointer, channel, lock)


def follow(trainer: Any, checkpointer: Any, channel: CommandChannel) -> int:
    """Make process 0's collective calls until it says stop; returns the steps trained here."""
    steps, t0 = 0, time.monotonic()
    while True:
        kind, payload = channel.receive()
        if kind == "step":
            trainer.step(payload)
            steps += 1
        elif kind == "engine_params":
            trainer.engine_params(payload)
        elif kind == "host_params":
            trainer.host_params()
        elif kind == "save":
            steps_done, meta = payload
            checkpointer.save(steps_done, trainer.state_dict(), meta)
            trainer.lend(checkpointer.wait_written)  # as process 0's controller does
        elif kind == "close":
            checkpointer.close()
        elif kind == "stop":
            log.info("lockstep: process 0 ended the job after %d steps (%.0f s)", steps, time.monotonic() - t0)
            return steps
        else:
            raise RuntimeError(f"lockstep: unknown command {kind!r} from process 0")
