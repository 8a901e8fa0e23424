"""Multi-host JAX: two processes on localhost train exactly like one process on the same data.

The worker half of this module runs in subprocesses (`python -m
tests.jaxrl_async.cluster.test_distributed WORKER ...`): each process owns 4/N CPU devices, joins
the job through `initialize_distributed` (gloo collectives), builds the same (data=2, fsdp=2)
mesh over the 4 global devices and runs the real `Trainer` for a few steps on the same batch.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from jaxrl_async.cluster.distributed import DistributedConfig, InitArgs, first_slurm_host, resolve
from tests.helpers import REPO

STEPS = 3


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run_workers(num_processes: int, out: Path) -> None:
    port = _free_port()
    env = {**os.environ, "JAX_PLATFORMS": "cpu",
           "XLA_FLAGS": f"--xla_force_host_platform_device_count={4 // num_processes}"}
    procs = [subprocess.Popen(
        [sys.executable, "-m", "tests.jaxrl_async.cluster.test_distributed", "WORKER", str(i),
         str(num_processes), str(port), str(out)],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for i in range(num_processes)]
    logs = [p.communicate(timeout=240)[0] for p in procs]
    for p, log in zip(procs, logs):
        assert p.returncode == 0, log[-3000:]


@pytest.mark.slow
def test_two_processes_reach_the_same_parameters_as_one_process_after_three_steps(tmp_path):
    _run_workers(1, tmp_path / "one.npz")
    _run_workers(2, tmp_path / "two.npz")
    one, two = np.load(tmp_path / "one.npz"), np.load(tmp_path / "two.npz")
    assert sorted(one.files) == sorted(two.files)
    initial = np.load(tmp_path / "one.npz.initial.npz")
    moved = max(float(np.abs(one[k] - initial[k]).max()) for k in one.files)
    assert moved > 1e-4, "the steps did not change the parameters; the comparison would be empty"
    for key in one.files:
        np.testing.assert_allclose(two[key], one[key], rtol=1e-5, atol=1e-6, err_msg=key)


def test_slurm_environment_gives_coordinator_rank_and_count():
    env = {"SLURM_NTASKS": "4", "SLURM_PROCID": "3", "SLURM_STEP_NODELIST": "gpu[003-004,9],cpu1"}
    args = resolve(DistributedConfig(mode="auto", port=9000), env)
    assert args == InitArgs("slurm", "gpu003:9000", 4, 3)


def test_configured_process_count_that_differs_from_slurm_is_a_one_line_error():
    env = {"SLURM_NTASKS": "4", "SLURM_PROCID": "0", "SLURM_JOB_NODELIST": "n1"}
    with pytest.raises(ValueError, match=r"num_processes=2 but SLURM_NTASKS=4") as err:
        resolve(DistributedConfig(mode="slurm", num_processes=2), env)
    assert "\n" not in str(err.value)


def test_configured_process_count_that_differs_from_the_tpu_slice_is_an_error():
    env = {"TPU_WORKER_HOSTNAMES": "t0,t1,t2,t3"}
    with pytest.raises(ValueError, match=r"num_processes=2 but the TPU slice has 4 workers"):
        resolve(DistributedConfig(num_processes=2), env)
    assert resolve(DistributedConfig(), env) == InitArgs("tpu")


def test_multi_process_count_without_any_multi_host_environment_is_an_error():
    with pytest.raises(ValueError, match=r"num_processes=2 but no multi-host environment"):
        resolve(DistributedConfig(num_processes=2), {})
    assert resolve(DistributedConfig(), {}) is None


def test_process_id_outside_the_process_count_is_refused():
    with pytest.raises(ValueError, match=r"process_id=2: must be in \[0, num_processes=2\)"):
        DistributedConfig(mode="explicit", coordinator_address="127.0.0.1:1", num_processes=2, process_id=2)


def test_launcher_environment_gives_an_explicit_coordinator():
    env = {"JAXRL_COORDINATOR_ADDRESS": "10.0.0.1:8476", "JAXRL_NUM_PROCESSES": "4", "JAXRL_PROCESS_ID": "2"}
    assert resolve(DistributedConfig(), env) == InitArgs("explicit", "10.0.0.1:8476", 4, 2)
    with pytest.raises(ValueError, match=r"process_id=4: must be in \[0, num_processes=4\)"):
        resolve(DistributedConfig(), {**env, "JAXRL_PROCESS_ID": "4"})


def test_first_slurm_host_reads_plain_and_bracketed_lists():
    assert first_slurm_host("node7") == "node7"
    assert first_slurm_host("a[10-12]") == "a10"
    assert first_slurm_host("b[5,7],c1") == "b5"


# --------------------------------------------------------------------- subprocess worker


def _worker(process_id: int, num_processes: int, port: int, out: str) -> None:
    import jax
    from flax import nnx
    from jax.experimental import multihost_utils

    from jaxrl_async.cluster.distributed import initialize_distributed
    from jaxrl_async.models import ModelConfig, Transformer
    from jaxrl_async.sharding import make_mesh
    from jaxrl_async.trainer.batch import pad_batch
    from jaxrl_async.trainer.config import TrainerConfig
    from jaxrl_async.trainer.optim import OptimConfig
    from jaxrl_async.trainer.trainer import Trainer

    if num_processes > 1:
        initialize_distributed(DistributedConfig(
            mode="explicit", coordinator_address=f"127.0.0.1:{port}",
            num_processes=num_processes, process_id=process_id, initialization_timeout_s=120))
    assert jax.device_count() == 4 and jax.local_device_count() == 4 // num_processes
    model = Transformer(ModelConfig.tiny(), rngs=nnx.Rngs(0))
    trainer = Trainer(model, TrainerConfig(optim=OptimConfig(lr=1e-3, max_grad_norm=None)),
                      mesh=make_mesh(data=2, fsdp=2))
    rng = np.random.default_rng(0)  # the same global batch in every process
    samples = [(rng.integers(0, 256, 5).tolist(), rng.integers(0, 256, 7).tolist(),
                (-rng.random(7)).tolist(), float(i % 2), i // 2) for i in range(8)]
    batch = pad_batch(samples, rows_multiple=4)

    def gathered() -> dict[str, np.ndarray]:
        # One gather of the whole tree (each separate cross-process program costs a Gloo setup).
        tree = trainer.params()
        if num_processes > 1:
            tree = multihost_utils.process_allgather(tree, tiled=True)
        return {jax.tree_util.keystr(p): np.asarray(x) for p, x in jax.tree_util.tree_flatten_with_path(tree)[0]}

    initial = gathered() if num_processes == 1 else None  # the parity run checks the steps moved
    for _ in range(STEPS):
        trainer.step(batch)
    final = gathered()
    if process_id == 0:
        if initial is not None:
            np.savez(out + ".initial.npz", **initial)
        np.savez(out, **final)


if __name__ == "__main__" and sys.argv[1:2] == ["WORKER"]:
    _worker(int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5])
