"""`jaxrl_async.train cluster=ray` under SIGTERM: the run's own handler, not Ray's, answers it — the
running step finishes, a checkpoint is written, the process exits 143 (a stopped run) and
`resume=true` completes the run with a clean audit. (ray.init installs a SIGTERM handler that exits at once; the run joins Ray
before installing its own, docs/fault_tolerance.md.)

Runs against the cluster in RAY_ADDRESS (CI: the loopback head that .ci/run starts) or a private
local one, as a real `python -m jaxrl_async.train` subprocess.
"""

from __future__ import annotations

import json
import os
import signal

import pytest

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
pytest.importorskip("ray", reason="ray is not installed (pip install -e '.[ray]')")
pytestmark = [pytest.mark.ray, pytest.mark.slow]

from planner.ledger_audit import audit  # noqa: E402
from tests.helpers.cli_runs import finished_checkpoints, launch, lines, wait_until  # noqa: E402

ADDRESS = os.environ.get("RAY_ADDRESS", "local")
RUN = ["cluster=ray", f"cluster.address={ADDRESS}", "cluster.num_workers=2", "cluster.cpus_per_worker=0.5",
       "engine.num_slots=8", "engine.max_len=64", "steps=10", "batch_groups=2", "group_size=4",
       "max_new_tokens=24", "max_staleness=1"]


def test_sigterm_under_ray_checkpoints_and_the_run_resumes(tmp_path):
    run_dir = tmp_path / "run"
    proc = launch(run_dir, *RUN)
    wait_until(proc, lambda: len(lines(run_dir / "metrics.jsonl")) >= 3, "3 steps were trained", timeout_s=600)
    proc.send_signal(signal.SIGTERM)
    log = proc.communicate(timeout=300)[0]
    # 143 after the run's own stop (a checkpoint, the resume line); Ray's handler would exit at once, unsaved.
    assert proc.returncode == 128 + signal.SIGTERM, log[-3000:]
    assert "SIGTERM: stopping at the next step boundary with a checkpoint" in log
    assert f"resume with resume={run_dir}" in log
    stopped = json.loads((run_dir / "summary.json").read_text())
    assert not stopped["completed"] and max(finished_checkpoints(run_dir)) == stopped["steps"] >= 3

    log = launch(run_dir, *RUN, "resume=true").communicate(timeout=600)[0]
    report = audit(run_dir, 1)
    assert report.ok and report.steps == 10 and not report.lost and not report.trained_twice, log[-3000:]
