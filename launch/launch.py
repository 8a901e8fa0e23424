"""One entry for every way to start `python -m jaxrl_async.train`: each target turns its options
and the Hydra overrides into the exact commands to run; `--dry-run` prints them (one a line, with
any environment assignments in front) and runs nothing.

Targets (docs/scale_out.md has a worked example of each):
- `local`         one process on this machine.
- `multiprocess`  N JAX processes on this machine joined through jax.distributed (explicit
                  coordinator on 127.0.0.1, `JAXRL_*` environment, see cluster/distributed.py).
- `ray`           `ray job submit` to a running Ray cluster (start one with `ray up
                  launch/ray/cluster.yaml` or `ray start --head`); generation on Ray actors.
- `slurm`         Hydra's submitit launcher (`hydra/launcher=slurm`, conf/hydra/launcher/slurm.yaml).
- `sbatch`        the plain sbatch template launch/slurm/train.sbatch.
- `tpu`           every worker of a TPU VM pod slice through `gcloud compute tpus tpu-vm ssh --worker=all`.

To add a target: write `_<name>(args, overrides) -> list[Command]` and add it to `TARGETS`.
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

TRAIN = ["python", "-m", "jaxrl_async.train"]
REPO = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Command:
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)

    def render(self) -> str:
        prefix = " ".join(f"{k}={shlex.quote(v)}" for k, v in self.env.items())
        return (prefix + " " if prefix else "") + shlex.join(self.argv)


def _local(args: argparse.Namespace, overrides: list[str]) -> list[Command]:
    return [Command(TRAIN + overrides)]


def _multiprocess(args: argparse.Namespace, overrides: list[str]) -> list[Command]:
    if args.nproc < 1:
        raise ValueError(f"--nproc={args.nproc}: must be >= 1")
    address = f"127.0.0.1:{args.port}"
    return [Command(TRAIN + overrides, {"JAXRL_COORDINATOR_ADDRESS": address,
                                        "JAXRL_NUM_PROCESSES": str(args.nproc), "JAXRL_PROCESS_ID": str(i)})
            for i in range(args.nproc)]


def _ray(args: argparse.Namespace, overrides: list[str]) -> list[Command]:
    return [Command(["ray", "job", "submit", f"--address={args.address}", f"--working-dir={args.working_dir}",
                     "--", *TRAIN, "cluster=ray", *overrides])]


def _slurm(args: argparse.Namespace, overrides: list[str]) -> list[Command]:
    # Every task joins jax.distributed from the SLURM environment (distributed mode "auto").
    launcher = ["--multirun", "hydra/launcher=slurm", f"hydra.launcher.nodes={args.nodes}",
                f"hydra.launcher.tasks_per_node={args.tasks_per_node}",
                f"hydra.launcher.gpus_per_node={args.gpus_per_node}", f"hydra.launcher.timeout_min={args.time_min}"]
    if args.partition:
        launcher.append(f"hydra.launcher.partition={args.partition}")
    return [Command(TRAIN + launcher + overrides)]


def _sbatch(args: argparse.Namespace, overrides: list[str]) -> list[Command]:
    argv = ["sbatch", f"--nodes={args.nodes}", f"--ntasks-per-node={args.tasks_per_node}",
            f"--gpus-per-node={args.gpus_per_node}", f"--time={args.time_min}"]
    if args.partition:
        argv.append(f"--partition={args.partition}")
    return [Command(argv + ["launch/slurm/train.sbatch", *overrides])]


def _tpu(args: argparse.Namespace, overrides: list[str]) -> list[Command]:
    if not args.tpu_name or not args.zone:
        raise ValueError("tpu target needs --tpu-name and --zone")
    # JAX finds the pod's coordinator and ranks itself on TPU VMs (distributed mode "tpu").
    remote = f"cd {shlex.quote(args.remote_dir)} && JAXRL_DISTRIBUTED_MODE=tpu " + shlex.join(TRAIN + overrides)
    return [Command(["gcloud", "compute", "tpus", "tpu-vm", "ssh", args.tpu_name, f"--zone={args.zone}",
                     "--worker=all", f"--command={remote}"])]


TARGETS: dict[str, Callable[[argparse.Namespace, list[str]], list[Command]]] = {
    "local": _local, "multiprocess": _multiprocess, "ray": _ray, "slurm": _slurm, "sbatch": _sbatch, "tpu": _tpu,
}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m launch", description=__doc__.split("\n\n")[0])
    p.add_argument("target", choices=sorted(TARGETS))
    p.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    p.add_argument("--nproc", type=int, default=2, help="multiprocess: processes")
    p.add_argument("--port", type=int, default=8476, help="multiprocess: coordinator port")
    p.add_argument("--address", default="http://127.0.0.1:8265", help="ray: job-submission address")
    p.add_argument("--working-dir", default=".", help="ray: directory shipped to the cluster")
    p.add_argument("--nodes", type=int, default=1, help="slurm/sbatch: nodes")
    p.add_argument("--tasks-per-node", type=int, default=1, help="slurm/sbatch: JAX processes per node")
    p.add_argument("--gpus-per-node", type=int, default=1, help="slurm/sbatch: GPUs per node")
    p.add_argument("--time-min", type=int, default=240, help="slurm/sbatch: time limit (minutes)")
    p.add_argument("--partition", default=None, help="slurm/sbatch: partition")
    p.add_argument("--tpu-name", default=None, help="tpu: TPU VM name")
    p.add_argument("--zone", default=None, help="tpu: zone")
    p.add_argument("--remote-dir", default="jaxrl-async", help="tpu: repository checkout on every worker")
    return p


def commands(argv: Sequence[str]) -> tuple[argparse.Namespace, list[Command]]:
    """Parse `argv` (target, options, then Hydra overrides) into the commands to run."""
    args, overrides = _parser().parse_known_args(list(argv))
    bad = [o for o in overrides if o.startswith("--")]
    if bad:
        raise ValueError(f"unknown option {bad[0]} for target {args.target} (Hydra overrides are key=value)")
    return args, TARGETS[args.target](args, overrides)


def main(argv: Sequence[str] | None = None) -> int:
    args, cmds = commands(sys.argv[1:] if argv is None else argv)
    if args.dry_run:
        for cmd in cmds:
            print(cmd.render())
        return 0
    procs = [subprocess.Popen([sys.executable if c.argv[0] == "python" else c.argv[0], *c.argv[1:]],
                              env={**os.environ, **c.env}, cwd=REPO) for c in cmds]
    return max(p.wait() for p in procs)
