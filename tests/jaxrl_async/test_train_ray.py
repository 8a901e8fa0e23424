"""`jaxrl_async.train cluster=ray`: real runs with the JAX engines in Ray actors, and one whose worker
is killed mid-run (its groups must go through the planner's fault path and still be trained once,
within η).

Runs against the cluster in RAY_ADDRESS (CI: the loopback head that .ci/run starts) or a private
local one. Each run: 2 workers, tiny model, 6 steps of 2 groups x 4 samples, η = 1.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

# Keep Ray's servers on the loopback (it otherwise swaps 127.0.0.1 for the host's address).
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
ray = pytest.importorskip("ray", reason="ray is not installed (pip install -e '.[ray]')")
pytestmark = [pytest.mark.ray, pytest.mark.slow]


from jaxrl_async.train import TrainJob, typed_config  # noqa: E402
from planner.audit import audit  # noqa: E402
from tests.helpers.train_runs import StepProbe, compose_train, read_jsonl  # noqa: E402

ADDRESS = os.environ.get("RAY_ADDRESS", "local")
ETA = 1
RUN = ["progress=off", "tensorboard=false", "export_hf=false", "cluster=ray", f"cluster.address={ADDRESS}",
       "cluster.num_workers=2", "cluster.cpus_per_worker=0.5", "engine.num_slots=8", "engine.max_len=64",
       "steps=6", "batch_groups=2", "group_size=4", "max_new_tokens=24", f"max_staleness={ETA}"]


@pytest.fixture(scope="module", autouse=True)
def ray_session():
    yield
    ray.shutdown()


def _job(run_dir: Path) -> TrainJob:
    return TrainJob(typed_config(compose_train(RUN)), run_dir)


def _assert_strict_and_complete(run_dir: Path, summary: dict) -> None:
    report = audit(run_dir, ETA)
    assert report.ok, report.verdict()
    assert report.steps == 6 and report.groups_trained == 12 and report.groups_dropped == 0 and not report.lost
    assert report.max_token_staleness <= ETA
    assert summary["completed"] and summary["audit_ok"] and summary["groups_dropped"] == 0


def test_a_ray_run_trains_every_group_once_within_the_bound(tmp_path):
    job = _job(tmp_path)
    summary = job.run()
    _assert_strict_and_complete(tmp_path, summary)
    assert summary["groups_readmitted"] == 0
    assert len(read_jsonl(tmp_path / "metrics.jsonl")) == 6


def test_a_killed_generation_worker_costs_no_group_and_keeps_the_bound(tmp_path):
    job = _job(tmp_path)
    proxy = job.controller.engine
    kills: list[dict[str, object]] = []

    def kill_a_busy_worker(record: dict) -> None:
        """After a step, SIGKILL the busiest worker (three kills at most).

        A request whose last poll answer is already on the wire survives its worker's death, so
        one kill can happen to lose nothing; three kills make that vanishingly unlikely. Any step
        may kill: with a fast engine, workers are often idle when a step ends.
        """
        if len(kills) >= 3:
            return
        busy = [w for w in proxy.workers if w.alive and w.live]
        if busy:
            worker = max(busy, key=lambda w: len(w.live))
            kills.append({"pid": worker.pid, "step": record["step"], "requests": sorted(worker.live)})
            os.kill(worker.pid, signal.SIGKILL)

    job.controller.sinks.append(StepProbe(kill_a_busy_worker))
    summary = job.run()

    assert kills, "no step ended with a worker holding requests: nothing was killed"
    killed = {"kills": kills}
    held = {int(r.split(".")[0]) for k in kills for r in k["requests"]}
    ledger = read_jsonl(tmp_path / "ledger.jsonl")
    admits = [e["uid"] for e in ledger if e["event"] == "admit"]
    trained = [g["uid"] for e in ledger if e["event"] == "train" for g in e["groups"]]
    # The re-admitted groups are the dead worker's (a poll answer already on the wire may still
    # deliver a group it finished), and each was trained exactly once.
    lost_uids = {uid for uid in admits if admits.count(uid) >= 2}
    readmissions = sum(admits.count(uid) - 1 for uid in lost_uids)
    assert lost_uids and lost_uids <= held, (killed, admits)
    assert all(trained.count(uid) == 1 for uid in lost_uids)
    assert summary["groups_readmitted"] == readmissions
    _assert_strict_and_complete(tmp_path, summary)
    assert audit(tmp_path, ETA).readmissions == readmissions
