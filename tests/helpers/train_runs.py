"""Shared by the runtime / train / checkpoint tests: compose `conf/train.yaml` and run a job in-process."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

from hydra import compose, initialize_config_dir
from omegaconf import DictConfig

from jaxrl_async.cli.config_nodes import register_config_nodes
from jaxrl_async.job.lifecycle import TrainJob
from jaxrl_async.job.setup import typed_config
from tests.helpers import CONF

# Small and quiet: what every test run shares (each test adds its own sizes).
QUIET = ["progress=off", "tensorboard=false", "export_hf=false", "engine.num_slots=32", "engine.max_len=64"]


def compose_train(overrides: list[str]) -> DictConfig:
    """`conf/train.yaml` with `overrides`, as `python -m jaxrl_async.train` composes it."""
    register_config_nodes()
    with initialize_config_dir(str(CONF), version_base="1.3"):
        return compose("train", overrides=overrides)


def make_job(run_dir: Path, overrides: list[str]) -> TrainJob:
    return TrainJob(typed_config(compose_train(QUIET + overrides)), run_dir)


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


class StepProbe:
    """A metrics sink that calls `fn(record)` after every step (stops, snapshots)."""

    def __init__(self, fn) -> None:
        self.fn = fn

    def write(self, record: dict[str, Any]) -> None:
        self.fn(record)

    def close(self) -> None:
        pass


def run_within(job, seconds: float):
    """`job.run()` in a daemon thread: a run that wedges fails the test instead of hanging it."""
    out: dict = {}

    def target():
        try:
            out["summary"] = job.run()
        except BaseException as e:  # noqa: BLE001 - re-raised in the test's thread
            out["error"] = e

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"the run wedged: not finished after {seconds} s"
    if "error" in out:
        raise out["error"]
    return out["summary"]
