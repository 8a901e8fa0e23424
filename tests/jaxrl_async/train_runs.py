"""Shared by the runtime / train / checkpoint tests: compose `conf/train.yaml` and run a job in-process."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hydra import compose, initialize_config_dir

from jaxrl_async.train import TrainJob, typed_config

CONF_DIR = Path(__file__).resolve().parents[2] / "conf"

# Small and quiet: what every test run shares (each test adds its own sizes).
QUIET = ["progress=off", "tensorboard=false", "export_hf=false", "engine.num_slots=32", "engine.max_len=64"]


def make_job(run_dir: Path, overrides: list[str]) -> TrainJob:
    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        cfg = compose("train", overrides=QUIET + overrides)
    return TrainJob(typed_config(cfg), run_dir)


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
