"""A training run writes the simulator's metric keys, so one plotting function reads both runs."""

import errno
import json
import shutil

import pytest

from jaxrl_async.runtime.metrics import JsonlSink, TensorBoardSink
import planner.policies.lookahead  # noqa: F401  (registers lookahead)
from planner.ledger import LedgerWriter
from planner.registry import make_policy
from planner.run_files import STEP_KEYS, SUMMARY_KEYS
from planner.sim import SimConfig, Simulator, make_workload
from planner.sim.metrics import write_outputs
from planner.tools.plots import run_plots
from planner.types import PlanContext
from tests.helpers.filesystems import small_filesystem
from tests.helpers.train_runs import make_job, read_jsonl

pytestmark = pytest.mark.slow


def simulated_run(run_dir):
    ctx = PlanContext(batch_groups=4, group_size=4, max_staleness=1, total_steps=5)
    with LedgerWriter(run_dir / "ledger.jsonl") as ledger:
        result = Simulator(make_policy("lookahead", ctx), ctx, make_workload({"name": "lognormal"}, 4), SimConfig(),
                           seed=0, ledger=ledger).run()
    write_outputs(run_dir, result.summary, result.steps)


def test_a_training_run_and_a_simulated_run_share_their_keys_and_plot_with_the_same_function(tmp_path):
    train_dir, sim_dir = tmp_path / "train", tmp_path / "sim"
    make_job(train_dir, ["steps=3", "batch_groups=2", "group_size=4", "max_new_tokens=4"]).run()
    simulated_run(sim_dir)
    for run_dir in (train_dir, sim_dir):
        summary = json.loads((run_dir / "summary.json").read_text())
        assert list(summary)[: len(SUMMARY_KEYS)] == list(SUMMARY_KEYS), run_dir.name
        rows = read_jsonl(run_dir / "metrics.jsonl")
        assert [list(r)[: len(STEP_KEYS)] for r in rows] == [list(STEP_KEYS)] * len(rows), run_dir.name
        # tokens_per_s has one meaning: tokens trained in the step / seconds since the previous record
        previous = 0.0
        for r in rows:
            assert r["tokens_per_s"] == pytest.approx(r["tokens_trained"] / (r["elapsed_s"] - previous), rel=1e-3)
            assert r["start_s"] <= r["end_s"] <= r["elapsed_s"] and r["version"] == r["step"] + 1
            previous = r["elapsed_s"]
        out = tmp_path / f"{run_dir.name}_plots"
        out.mkdir()
        assert all(p.stat().st_size > 0 for p in run_plots(run_dir, out))
    train_rows, sim_rows = read_jsonl(train_dir / "metrics.jsonl"), read_jsonl(sim_dir / "metrics.jsonl")
    assert all(r["reward_mean"] is not None and r["loss"] is not None for r in train_rows)
    assert all(r["reward_mean"] is None and r["loss"] is None for r in sim_rows)  # no model in the simulator


def test_an_engines_load_lists_each_replicas_active_sequences_and_the_share_of_slots_in_use():
    from jaxrl_async.engines.base import EngineStats
    from jaxrl_async.runtime.metrics import EngineLoad

    replicas = EngineLoad.of(EngineStats(6, 8, 0, 0.5, 3, extra={"per_replica_active": [4, 2]}))
    single = EngineLoad.of(EngineStats(3, 0, 0, 0.5, 3))
    assert (replicas.active, replicas.usage) == ([4, 2], 0.75)
    assert (single.active, single.usage) == ([3], 3.0)  # no slots reported: counted against one


def _events(path):
    """(step, tag, value) of every scalar in a TensorBoard event file, read with its own record format."""
    import struct

    from tensorboardX.proto.event_pb2 import Event

    data, out, at = path.read_bytes(), [], 0
    while at < len(data):
        (n,) = struct.unpack("Q", data[at:at + 8])
        event = Event.FromString(data[at + 12:at + 12 + n])
        at += 12 + n + 4
        out += [(event.step, v.tag, v.simple_value) for v in event.summary.value]
    return out


def test_the_tensorboard_sink_writes_each_step_s_scalars_to_one_event_file_at_once(tmp_path):
    sink = TensorBoardSink(tmp_path / "tb")
    sink.write({"step": 0, "loss": 0.5, "done": True, "name": "x"})
    sink.write({"step": 1, "loss": 0.25})
    # Flushed per step: readable before close.
    assert _events(sink.path) == [(0, "loss", 0.5), (1, "loss", 0.25)]
    sink.close()
    assert [p.name for p in (tmp_path / "tb").iterdir()] == [sink.path.name]


def test_a_full_disk_is_an_oserror_naming_the_event_file_and_the_sink_closes_quietly(tmp_path, capfd):
    with small_filesystem(tmp_path / "small", "64k") as mount:
        sink = TensorBoardSink(mount / "tb")
        with pytest.raises(OSError) as e:
            for step in range(100_000):  # 64 KiB holds a few thousand scalars
                sink.write({"step": step, "loss": 0.5, "reward": 1.0})
        assert e.value.errno == errno.ENOSPC and e.value.filename == str(sink.path)
        sink.close()  # quiet: no second error
    assert "Traceback" not in capfd.readouterr().err  # no writer thread died


def test_a_full_disk_under_metrics_jsonl_names_the_file(tmp_path):
    with small_filesystem(tmp_path / "small", "64k") as mount:
        sink = JsonlSink(mount / "metrics.jsonl", append=False)
        with pytest.raises(OSError) as e:
            for step in range(100_000):
                sink.write({"step": step, "loss": 0.5})
        assert e.value.errno == errno.ENOSPC and e.value.filename == str(mount / "metrics.jsonl")
        sink.close()


@pytest.mark.skipif(shutil.which("tensorboard") is None,
                    reason="no tensorboard command (a [project] dependency: `pip install -e .` brings it)")
def test_the_readmes_tensorboard_command_serves_a_runs_events_on_loopback_and_stops(tmp_path):
    """`tensorboard --logdir RUN_DIR` (README) finds the sink's events under RUN_DIR/tb; bound to
    127.0.0.1 on a free port, stopped by SIGTERM, every wait bounded."""
    import re
    import subprocess
    import threading
    import time
    import urllib.request

    sink = TensorBoardSink(tmp_path / "tb")
    for step in range(3):
        sink.write({"step": step, "reward_mean": 0.25 * step, "loss": 0.5})
    sink.close()
    proc = subprocess.Popen(["tensorboard", "--logdir", str(tmp_path), "--host", "127.0.0.1", "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url: list[str] = []
    listening = threading.Event()

    def watch() -> None:  # it prints its address once it listens
        for line in proc.stdout:
            if match := re.search(r"http://127\.0\.0\.1:\d+/", line):
                url.append(match.group())
                listening.set()

    threading.Thread(target=watch, daemon=True).start()
    try:
        assert listening.wait(90), "tensorboard printed no http://127.0.0.1:PORT/ within 90 s"
        deadline, tags = time.monotonic() + 60, {}
        while "reward_mean" not in tags.get("tb", []) and time.monotonic() < deadline:
            time.sleep(0.5)  # it loads the event files in the background after it listens
            with urllib.request.urlopen(url[0] + "data/plugin/scalars/tags", timeout=10) as r:
                tags = json.loads(r.read())
        assert {"reward_mean", "loss"} <= set(tags.get("tb", [])), tags
        with urllib.request.urlopen(url[0] + "data/plugin/scalars/scalars?run=tb&tag=reward_mean", timeout=10) as r:
            assert [(step, value) for _, step, value in json.loads(r.read())] == [(0, 0.0), (1, 0.25), (2, 0.5)]
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=30)
    assert proc.returncode is not None
