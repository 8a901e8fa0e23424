"""`cluster.address=local`: the private cluster that `connect` starts outlives the call.

Ray starts the head's processes with PR_SET_PDEATHSIG, which fires when the thread that started
them ends; a start from a helper thread killed the cluster a second later (the driver then
died when its GCS did not come back). Runs in a subprocess of its own: `ray.init` is per process,
and CI's Ray stage joins its loopback head in this one.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("ray", reason="ray is not installed (pip install -e '.[ray]')")
pytestmark = [pytest.mark.ray, pytest.mark.slow]

SCRIPT = textwrap.dedent("""
    import os, time
    os.environ.pop("RAY_ADDRESS", None)
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    import ray
    from jaxrl_async.cluster.ray.config import RayClusterConfig
    from jaxrl_async.cluster.ray.connect import connect

    connect(RayClusterConfig(address="local"))
    time.sleep(3)  # the helper thread's death took the head down within about a second

    @ray.remote(num_cpus=0)
    def answer():
        return 42

    print("answer", ray.get(answer.remote(), timeout=30))
    ray.shutdown()
""")


def test_a_private_local_cluster_outlives_connect_and_runs_a_task():
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=180)
    assert done.returncode == 0 and "answer 42" in done.stdout, done.stdout[-2000:] + done.stderr[-2000:]
