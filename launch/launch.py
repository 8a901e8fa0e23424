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

Every process of one job must write to one run directory, so the targets that start several
processes with the same command line (`multiprocess`, `tpu`) pin `hydra.run.dir` when the
overrides do not (Hydra's default names it after the second each process starts in).

Running the commands (not `--dry-run`), the launcher supervises them as one job: SIGTERM or
Ctrl-C goes to process 0, which checkpoints and then tells the others to stop
(jaxrl_async/cluster/lockstep.py), and the job's status is process 0's (130 / 143: stopped, with
its resume line; jaxrl_async/cli/train.py); when any process exits with an error, the others get SIGTERM,
then SIGKILL after `--grace-s` seconds, and the launcher exits with that error's status — a dead
process ends the job instead of leaving the rest waiting in a collective. The others' lines after
that (their view of the dead peer: 20-65 lines of Gloo and coordination-service errors) are kept
out of the terminal and counted (launch/relay.py).

To add a target: write `_<name>(args, overrides) -> list[Command]` and add it to `TARGETS`.
"""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from launch.relay import StderrRelay
from planner.tools.entry import ArgumentParser, fail, nearest

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


def _pinned_run_dir(overrides: list[str], target: str) -> list[str]:
    """The overrides with a `hydra.run.dir` every process shares (see the module docstring)."""
    if any(o.startswith("hydra.run.dir=") for o in overrides):
        return overrides
    return [f"hydra.run.dir=outputs/train/{target}-{time.strftime('%Y-%m-%d_%H-%M-%S')}", *overrides]


def _multiprocess(args: argparse.Namespace, overrides: list[str]) -> list[Command]:
    if args.nproc < 1:
        raise ValueError(f"--nproc={args.nproc}: must be >= 1")
    address = f"127.0.0.1:{args.port}"
    overrides = _pinned_run_dir(overrides, "multiprocess")
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
        missing = " and ".join(o for o, v in (("--tpu-name", args.tpu_name), ("--zone", args.zone)) if not v)
        raise ValueError(f"{missing}: required for target tpu (e.g. --tpu-name my-pod --zone us-central2-b)")
    # JAX finds the pod's coordinator and ranks itself on TPU VMs (distributed mode "tpu").
    overrides = _pinned_run_dir(overrides, "tpu")
    remote = f"cd {shlex.quote(args.remote_dir)} && JAXRL_DISTRIBUTED_MODE=tpu " + shlex.join(TRAIN + overrides)
    return [Command(["gcloud", "compute", "tpus", "tpu-vm", "ssh", args.tpu_name, f"--zone={args.zone}",
                     "--worker=all", f"--command={remote}"])]


TARGETS: dict[str, Callable[[argparse.Namespace, list[str]], list[Command]]] = {
    "local": _local, "multiprocess": _multiprocess, "ray": _ray, "slurm": _slurm, "sbatch": _sbatch, "tpu": _tpu,
}


def _parser() -> argparse.ArgumentParser:
    p = ArgumentParser(prog="python -m launch", description=__doc__.split("\n\n")[0])
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
    p.add_argument("--grace-s", type=float, default=30.0,
                   help="seconds the other processes get to exit after one fails, before SIGKILL")
    return p


def commands(argv: Sequence[str]) -> tuple[argparse.Namespace, list[Command]]:
    """Parse `argv` (target, options, then Hydra overrides) into the commands to run."""
    parser = _parser()
    args, overrides = parser.parse_known_args(list(argv))
    bad = [o for o in overrides if o.startswith("--")]
    if bad:
        close = nearest(bad[0].split("=")[0], [o for o in parser._option_string_actions if o.startswith("--")])
        hint = f"did you mean {' or '.join(close)}? " if close else ""
        raise ValueError(f"unknown option {bad[0]} for target {args.target} ({hint}Hydra overrides are key=value)")
    return args, TARGETS[args.target](args, overrides)


# Process 0's status when a signal stopped the job: it checkpointed and told the others to stop
# (they end by themselves), so that status is no failure to end them for.
STOPPED = (128 + signal.SIGINT, 128 + signal.SIGTERM)


def _failed(index: int, status: int | None) -> bool:
    return status not in (None, 0) and not (index == 0 and status in STOPPED)


def supervise(procs: list[subprocess.Popen], grace_s: float, poll_s: float = 0.2) -> int:
    """Wait for one job's processes (see the module docstring); returns the job's exit status."""
    def to_leader(signum, _frame):
        if procs[0].poll() is None:
            procs[0].send_signal(signum)

    previous = {sig: signal.signal(sig, to_leader) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        failed = None
        while failed is None and any(p.poll() is None for p in procs):
            failed = next((i for i, p in enumerate(procs) if _failed(i, p.poll())), None)
            time.sleep(poll_s)
        if failed is None:
            failed = next((i for i, p in enumerate(procs) if _failed(i, p.returncode)), None)
        if failed is None:
            return procs[0].returncode  # 0, or the status of process 0's stop
        rc = procs[failed].returncode
        alive = [p for p in procs if p.poll() is None]
        if not alive and len(procs) > 1:  # the others ended by themselves: say which one failed first
            print(f"launch: process {failed} exited with status {rc}", file=sys.stderr)
        if alive:
            print(f"launch: process {failed} exited with status {rc}; stopping the other {len(alive)}",
                  file=sys.stderr)
            for p in alive:
                p.terminate()
            deadline = time.monotonic() + grace_s
            while any(p.poll() is None for p in alive) and time.monotonic() < deadline:
                time.sleep(poll_s)
            for p in alive:
                if p.poll() is None:
                    p.kill()
                    p.wait()
        return rc if rc > 0 else 128 - rc  # killed by signal N: 128 + N, as a shell reports it
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args, cmds = commands(sys.argv[1:] if argv is None else argv)
    except ValueError as e:  # bad options for a target: one line, as every command (planner/tools/entry.py)
        fail(e)
    if args.dry_run:
        for cmd in cmds:
            print(cmd.render())
        return 0
    several = len(cmds) > 1  # one job of several processes: their stderr through StderrRelay
    procs = [subprocess.Popen([sys.executable if c.argv[0] == "python" else c.argv[0], *c.argv[1:]],
                              env={**os.environ, **c.env}, cwd=REPO, stderr=subprocess.PIPE if several else None)
             for c in cmds]
    relay = StderrRelay(procs, _run_dir(cmds[0].argv)) if several else None
    status = supervise(procs, args.grace_s)
    for line in relay.summary() if relay is not None else []:
        print(line, file=sys.stderr)
    return status


def _run_dir(argv: Sequence[str]) -> Path | None:
    """The `hydra.run.dir` of a command line (relative to the repository, where it runs)."""
    given = [a.split("=", 1)[1] for a in argv if a.startswith("hydra.run.dir=")]
    return REPO / given[-1] if given else None
