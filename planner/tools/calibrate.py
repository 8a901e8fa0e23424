"""`python -m planner.calibrate RUN_DIR`: fit the simulator's cost model to a real run's timing trace.

Reads `RUN_DIR/trace.jsonl` (planner/run_trace.py), fits by non-negative least squares

    decode iteration      s = (α·steps + β·tokens + p·prefill_tokens) / speed_w
    trainer step          s = c0 + c1·(response + prompt tokens of the batch)
                          (the batch handed over → the version published)

with, for a colocated engine (`colocated` in the trace's `run` line), the decode fit over the
iterations outside trainer steps and the slowdown σ of those inside them
(`sim.workers.colocated_slowdown`, 0 otherwise)

    decode iteration in a step  s = ((1 + σ)·(α·steps + β·tokens) + p·prefill_tokens) / speed_w

and takes the publish → load lag (median over every push and worker), the load time `t_sync`
(mean), the engine's workers, slots and KV tokens and its sync mode from the trace, and sets
`trainer.wait_sync` (the runtime pushes weights before it selects the next batch). It prints the
fit with its residuals, a warning for every fit that rests on too few lines (no more lines than
coefficients: nothing checks the coefficients) or explains less than half of its lines' spread
(R² < `R2_WARN`: the replay keeps the run's total, not how time varies with the load), and the
replay command, and writes `RUN_DIR/calibration.yaml`:

    sim:  {workers: {...}, trainer: {...}, admission_window: ...}   SimConfig keys
    fit:  per model: lines used, lines left out, RMS residual, R²; warnings   (read by people)
    run:  the run's planner context (policy and its parameters, η, B, n, steps, engine slots)
          and `replay`, the command that replays it

Replay (`replay_command`, printed): `python -m planner.simulate calibration=RUN_DIR/calibration.yaml
workload=trace workload.path=RUN_DIR/trace.jsonl policy=P max_staleness=η batch_groups=B
group_size=n steps=S hydra.run.dir=RUN_DIR/replay`, with P, η, B, n, S the run's own (its
`summary.json`, the trace's `run` line and its `.hydra/config.yaml` policy parameters): without
them the simulator runs its own defaults.

Tail terms (planner/tools/calibrate_tail.py): speculating iterations (`drafted` > 0) are left out
of the decode fit; from them come `sim.workers.speculation.{when, acceptance, tokens, draft_cost,
max_active}`, and from `migrate` lines `sim.workers.migration_s`. They are written only when the
trace holds them, so a run without speculation or migration calibrates exactly as before; a
simulator without those keys gets them in `fit.tail_terms` instead (with a warning).

Environment terms (planner/tools/calibrate_env.py): a run with multi-turn episodes (the trace's
`episode` lines) gets `workload=multi_turn` fitted to them — turns per episode, tokens per turn,
the environment's latency (log-normal body, Pareto tail), its timeouts and failure rate — in
`fit.environment.workload`, and its replay runs that workload (`workload=multi_turn
workload.KEY=...`) instead of replaying the groups' lengths.

Warm-up: iterations that compiled a jitted step (marked in the trace) and trainer steps longer
than `OUTLIER`× the median (the step's own compilation) are left out of the fits: their time is
XLA's, not the cost model's. What they took beyond the fitted model is the run's compile time,
`sim.workers.compile_s` (per worker, before its first decode step) and `sim.trainer.compile_s`
(added to the first step), so that the replay's whole-run steps/h includes the warm-up as the
run's does. A missing or malformed trace, or one without decode or train lines, is a one-line
error and exit status 1.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from planner.configs import build
from planner.registry import given_params
from planner.sim.config import SimConfig, WorkerConfig
from planner.tools import calibrate_env, calibrate_tail, entry
from planner.run_trace import TRACE_FILE, read_run_trace

CALIBRATION_FILE = "calibration.yaml"
SPEED_ROUNDS = 50  # alternating fits of the coefficients and the worker speeds
OUTLIER = 3.0  # a trainer step this many times the median compiled something: left out
R2_WARN = 0.5  # a fit whose R² is below this explains less than half of its lines' spread: warned
SPREAD_FLOOR = 1e-12  # lines whose spread is below this share of their size have none (R² undefined)


REPLAY_DIR = "replay"  # the replay command's run directory, inside the run's


@dataclass(frozen=True)
class Fit:
    """A least-squares fit: coefficients (>= 0) and how well they explain the data."""

    coef: np.ndarray
    used: int  # data lines fitted
    left_out: int  # lines left out (compilation)
    rms: float  # RMS residual, seconds
    r2: float  # coefficient of determination (nan when the data has no variance)
    rel: float  # total predicted / total measured − 1

    def quality(self) -> dict[str, Any]:
        return {"lines": self.used, "left_out": self.left_out, "rms_s": _round(self.rms),
                "r2": None if np.isnan(self.r2) else round(float(self.r2), 4), "total_error": round(float(self.rel), 4)}


def nnls(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Least squares with every coefficient >= 0: the best feasible solution over the subsets of
    columns (exact for the 2–3 columns fitted here). Collinear columns (every decode iteration at
    the same active count) get the minimum-norm split of numpy's `lstsq`."""
    best, best_err = np.zeros(x.shape[1]), float(np.sum(y ** 2))
    for k in range(1, x.shape[1] + 1):
        for cols in itertools.combinations(range(x.shape[1]), k):
            c, *_ = np.linalg.lstsq(x[:, cols], y, rcond=None)
            if np.all(c >= 0):
                coef = np.zeros(x.shape[1])
                coef[list(cols)] = c
                err = float(np.sum((x @ coef - y) ** 2))
                if err < best_err - 1e-15:
                    best, best_err = coef, err
    return best


def _fit(x: np.ndarray, y: np.ndarray, left_out: int) -> Fit:
    coef = nnls(x, y)
    pred = x @ coef
    ss = float(np.sum((y - y.mean()) ** 2))
    # Lines that differ by rounding only (every step of a run alike) have no spread to explain.
    r2 = 1 - float(np.sum((y - pred) ** 2)) / ss if ss > SPREAD_FLOOR * float(np.sum(y ** 2)) else float("nan")
    return Fit(coef, len(y), left_out, float(np.sqrt(np.mean((y - pred) ** 2))), r2, float(pred.sum() / y.sum() - 1))


def _round(v: float) -> float:
    return float(f"{v:.4g}")


def too_few_lines(what: str, coefficients: tuple[str, ...], lines: int) -> str | None:
    """A warning when a fit of `coefficients` rests on no more lines than it has coefficients:
    such a fit reproduces its lines whatever the truth, so nothing checks it."""
    if lines > len(coefficients):
        return None
    names = ", ".join(f"sim.{c}" for c in coefficients)
    return (f"{what}: {names} fitted to {lines} line{'s' if lines != 1 else ''} (needs more than "
            f"{len(coefficients)}): the fit is not checked by any residual; a longer run or one that varies the load helps")


def poor_fit(what: str, coefficients: tuple[str, ...], fit: Fit) -> str | None:
    """A warning when `fit` explains less than half of its lines' spread (R² < `R2_WARN`): its
    coefficients reproduce the lines' total (what the replay's steps/h rests on) but not how the
    time varies with the load, so the replay extrapolates poorly to other loads. Lines without
    spread (R² undefined) have nothing to explain; too few lines have their own warning."""
    if np.isnan(fit.r2) or fit.r2 >= R2_WARN or fit.used <= len(coefficients):
        return None
    names = ", ".join(f"sim.{c}" for c in coefficients)
    r2 = round(fit.r2, 2) + 0.0  # no "-0.00"
    return (f"{what}: R² {r2:.2f} < {R2_WARN}: {names} explain little of how its {fit.used} lines vary (RMS "
            f"residual {_round(fit.rms)} s); the replay matches this run's total ({fit.rel:+.1%}), not other loads: "
            "a run that varies the load (batch, lengths, slots) separates them")


def _need(lines: list, what: str, path: Path, why: str) -> None:
    if not lines:
        raise ValueError(f"{path}: no {what} lines ({why})")


def colocation_slowdown(in_steps: list[dict[str, Any]], coef: np.ndarray, speed: np.ndarray) -> float:
    """σ >= 0 of `s = (1 + σ)·(α·steps + β·tokens)/speed_w + p·prefill_tokens/speed_w` over the
    iterations that ran during trainer steps, by least squares given the fitted coefficients: the
    simulator slows decode steps, not prefill, so the prefill part is taken off before the ratio."""
    alpha, beta, prefill = coef
    w = speed[np.array([e["worker"] for e in in_steps])]
    d = np.array([alpha * e["steps"] + beta * e["tokens"] for e in in_steps]) / w
    rest = np.array([e["s"] - prefill * e["prefill_tokens"] / ws for e, ws in zip(in_steps, w)])
    if float(d @ d) <= 0:
        return 0.0
    return max(0.0, float(d @ rest) / float(d @ d) - 1.0)


def calibrate(run_dir: str | Path) -> dict[str, Any]:
    """The calibration mapping (`sim`, `fit`, `run`) of the run in `run_dir`; ValueError (one line)
    for a missing, malformed or unusable trace."""
    path = Path(run_dir) / TRACE_FILE
    if not Path(run_dir).is_dir():
        raise ValueError(f"{run_dir}: no such run directory")
    events = list(read_run_trace(path))
    by = {kind: [e for e in events if e["event"] == kind] for kind in ("run", "train", "publish", "load", "synced",
                                                                       "decode", "migrate", "episode", "finish",
                                                                       "admit")}
    _need(by["run"], "run", path, "every segment of a run starts with one; is this a run's trace?")
    head = by["run"][0]
    _need(by["train"], "train", path, "the run trained no step")
    timed = [e for e in by["decode"] if not e.get("compile")]
    _need(timed, "decode", path, f"engine={head.get('engine')} reports no iteration timings")
    # Speculating iterations cost more per step: the cost model is fitted to the plain ones, the
    # draft cost to the speculating ones beside it (planner/tools/calibrate_tail.py).
    speculating = [e for e in timed if e.get("drafted")]
    timed = [e for e in timed if not e.get("drafted")]
    _need(timed, "plain decode", path, "every timed iteration speculated: the draft cost needs plain ones to compare with")
    # A colocated engine decodes slower while the trainer trains: the cost model is fitted to the
    # iterations outside steps, the slowdown to those inside. Elsewhere (or with no iteration on
    # one side) every iteration is fitted alike and the slowdown is 0.
    colocated = bool(head.get("colocated"))
    in_steps = [e for e in timed if e.get("train")]
    outside = [e for e in timed if not e.get("train")]
    split = colocated and bool(in_steps) and bool(outside)
    decode = outside if split else timed

    # Decoding: the coefficients at speed 1 and each worker's speed, fitted in turn (each step is
    # a least-squares fit given the other) until they settle; speeds are relative (mean 1).
    x = np.array([[e["steps"], e["tokens"], e["prefill_tokens"]] for e in decode], float)
    y = np.array([e["s"] for e in decode], float)
    workers = int(head["workers"])
    index = np.array([e["worker"] for e in decode])
    speed = np.ones(workers)
    compiling = [e for e in by["decode"] if e.get("compile")]
    for _ in range(SPEED_ROUNDS if workers > 1 else 1):
        dec = _fit(x, y * speed[index], len(compiling))
        pred = x @ dec.coef
        for w in range(workers):
            mine = index == w
            if mine.any() and (pred[mine] * y[mine]).sum() > 0:  # y = pred / speed: least squares in 1/speed
                speed[w] = (pred[mine] ** 2).sum() / (pred[mine] * y[mine]).sum()
        speed /= speed.mean()
    dec = _fit(x, y * speed[index], dec.left_out)
    alpha, beta, prefill = dec.coef
    speeds = [round(float(s), 4) for s in speed] if workers > 1 else None
    slowdown = colocation_slowdown(in_steps, dec.coef, speed) if split else 0.0

    # The trainer: batch handed over -> version published (the last step publishes nothing: its end).
    published = {e["version"]: e["t"] for e in by["publish"]}
    steps = [(e["tokens"] + e["prompt_tokens"], published.get(e["step"] + 1, e["end"]) - e["t"]) for e in by["train"]]
    median = float(np.median([d for _, d in steps]))
    kept = [(tok, d) for tok, d in steps if d <= OUTLIER * median]
    tr = _fit(np.array([[1.0, tok] for tok, _ in kept]), np.array([d for _, d in kept]), len(steps) - len(kept))
    c0, c1 = tr.coef
    if c0 + c1 <= 0:
        raise ValueError(f"{path}: the train lines give a free trainer step (c0 = c1 = 0); is the trace complete?")

    # Warm-up: what the compiling lines and the left-out steps took beyond the fitted model.
    trainer_compile = sum(max(0.0, d - c0 - c1 * tok) for tok, d in steps if d > OUTLIER * median)
    decode_compile = sum(max(0.0, e["s"] - (alpha * e["steps"] + beta * e["tokens"] + prefill * e["prefill_tokens"])
                             / speed[e["worker"]]) for e in compiling) / workers  # per worker: all start late

    # Publish -> load: each worker's load start after the publish, and how long the load took.
    lags = [e["t"] - published[e["version"]] for e in by["load"] if e["version"] in published]
    if not lags:  # an engine that times no loads: the push's return stands for every worker's load
        lags = [e["t"] - published[e["version"]] for e in by["synced"] if e["version"] in published]
    load_lag = max(0.0, float(np.median(lags))) if lags else 0.0
    t_sync = float(np.mean([e["s"] for e in by["load"]])) if by["load"] else 0.0

    worker_keys: dict[str, Any] = {
        "num_workers": workers, "speeds": speeds, "max_concurrency": int(head["slots"]),
        "decode_alpha": _round(max(alpha, 1e-9)), "decode_beta": _round(beta), "prefill_per_token": _round(prefill),
        "t_sync": _round(t_sync), "load_lag": _round(load_lag), "colocated_slowdown": _round(slowdown),
        "compile_s": _round(decode_compile), "sync_mode": head.get("sync_mode", "partial")}
    if head.get("kv_tokens"):
        worker_keys["kv_capacity"] = int(head["kv_tokens"])
    if worker_keys["sync_mode"] == "pinned" and head.get("adapter_versions"):
        worker_keys["resident_versions"] = int(head["adapter_versions"])
    spec_lines = [e for e in speculating if not e.get("train")] if split else speculating
    tail_fit, tail_warnings = tail_terms(calibrate_tail.speculation(spec_lines or speculating, head, dec.coef, speed),
                                         calibrate_tail.migration(by["migrate"], prefill, speed), worker_keys)
    sim = {"workers": worker_keys, "trainer": {"c0": _round(c0), "c1": _round(c1), "wait_sync": True,
                                               "compile_s": _round(trainer_compile)}}
    if head.get("admission_window"):
        sim["admission_window"] = int(head["admission_window"])
    build(SimConfig, sim, "sim")  # what the replay will build: a bad fit fails here, not there
    lag_q = np.percentile(lags, [10, 50, 90]).round(6).tolist() if lags else []
    decode_what = "decode" + (" (iterations outside trainer steps)" if split else "")
    decode_coef = ("workers.decode_alpha", "workers.decode_beta", "workers.prefill_per_token")
    warnings = [w for w in (
        too_few_lines(decode_what, decode_coef, len(decode)),
        poor_fit(decode_what, decode_coef, dec),
        too_few_lines("trainer", ("trainer.c0", "trainer.c1"), len(kept)),
        poor_fit("trainer", ("trainer.c0", "trainer.c1"), tr),
        too_few_lines("colocation (iterations in trainer steps)", ("workers.colocated_slowdown",), len(in_steps))
        if split else None,
    ) if w] + tail_warnings
    if not lags:
        warnings.append("push: sim.workers.load_lag set to 0: no load or synced line follows a publish")
    run = run_context(Path(run_dir), head, by["train"])
    cal = {
        "sim": sim,
        "fit": {"decode": dec.quality() | {"in_steps": len(in_steps) if not split else 0},
                "trainer": tr.quality(),
                "load_lag_s": {"pushes": len(lags), "p10_p50_p90": lag_q},
                "colocation": {"colocated": colocated, "lines_in_steps": len(in_steps), "lines_outside": len(outside),
                               "fitted": split},
                "compile": {"decode_lines": len(compiling), "trainer_steps": len(steps) - len(kept)},
                **tail_fit, "warnings": warnings},
        "run": run,
    }
    env = calibrate_env.environment(by["episode"], by["finish"], by["admit"])
    if env is not None:
        cal["fit"]["environment"] = {**env["fit"], "workload": env["workload"]}
        if env["fit"]["tail_steps"] < 2:
            warnings.append("environment: fewer than 2 steps in the latency's tail: workload.env_tail_p set to 0")
    cal["run"]["replay"] = replay_command(Path(run_dir), cal)
    return cal


def tail_terms(spec: dict[str, Any] | None, mig: dict[str, Any] | None,
               worker_keys: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """Put the fitted speculation and migration terms into `worker_keys` (`sim.workers.speculation`,
    `sim.workers.migration_s`) where this simulator has them; returns the `fit` entries (nothing
    for a trace without them: its calibration is what it was) and their warnings. A simulator
    without the keys gets them in `fit.tail_terms` (dotted sim keys -> value) with a warning."""
    fields = {f.name for f in dataclasses.fields(WorkerConfig)}
    fit: dict[str, Any] = {}
    warnings: list[str] = []
    keys: dict[str, Any] = {}
    if spec is not None:
        fit["speculation"] = {"lines": spec["lines"], "kept_share": round(spec["kept_share"], 4)}
        if spec["acceptance"] is None:
            warnings.append("speculation: the trace's run line has no speculation.tokens (k): acceptance and "
                            "draft_cost are not fitted (kept share in fit.speculation)")
        else:
            keys.update({f"speculation.{k}": spec[k] if k in ("when", "tokens", "max_active") else _round(spec[k])
                         for k in ("when", "acceptance", "tokens", "draft_cost", "max_active")})
    if mig is not None:
        fit["migration"] = {"moves": mig["moves"]}
        keys["migration_s"] = _round(mig["migration_s"])
    if not keys:
        return fit, warnings
    if {k.split(".")[0] for k in keys} <= fields:
        for key, value in keys.items():
            section, _, name = key.partition(".")
            if name:
                worker_keys.setdefault(section, {})[name] = value
            else:
                worker_keys[key] = value
    else:
        fit["tail_terms"] = {f"sim.workers.{k}": v for k, v in keys.items()}
        warnings.append("this simulator has no sim.workers.speculation / migration_s: the fitted terms are in "
                        "fit.tail_terms, not applied")
    return fit, warnings


def run_context(run_dir: Path, head: dict[str, Any], trains: list[dict[str, Any]]) -> dict[str, Any]:
    """The run's planner context, what its replay must run: the policy, η, B and n of the trace's
    `run` line, the policy's parameters from the run's `.hydra/config.yaml` (those it set),
    the steps of its `summary.json` (else the trace's train lines) and the engine's slots."""
    run = {k: head.get(k) for k in ("policy", "max_staleness", "batch_groups", "group_size", "engine")}
    run["policy_params"] = policy_params(run_dir / ".hydra" / "config.yaml")
    summary_path = run_dir / "summary.json"
    summary = json.loads(summary_path.read_text(encoding="utf-8")) if summary_path.is_file() else {}
    run["steps"] = int(summary.get("steps", len({e["step"] for e in trains})))
    run["slots"] = int(head["slots"])
    return run


def policy_params(hydra_config: Path) -> dict[str, Any]:
    """The policy parameters a training run set (`policy:` of its composed config, by the rule
    both entry points apply, `registry.given_params`: `???` is not given); {} without the file.
    A config with no `???` at all predates that rule: its nulls meant "not given" and are left out."""
    if not hydra_config.is_file():
        return {}
    policy = dict((yaml.safe_load(hydra_config.read_text(encoding="utf-8")) or {}).get("policy") or {})
    policy.pop("name", None)
    given = given_params(policy)
    if len(given) == len(policy):  # no `???`: an older run's config
        given = {k: v for k, v in given.items() if v is not None}
    return given


def _arg(value: Any) -> str:
    """A value as a Hydra command-line override writes it (null, true, 3, [1, 2])."""
    return yaml.safe_dump(value, default_flow_style=True, width=10**6).strip().removesuffix("...").strip()


def replay_command(run_dir: Path, cal: dict[str, Any], calibration: Path | None = None) -> str:
    """The `planner.simulate` command that replays the run: its calibration, its groups, its own
    policy, η, B, n and steps (the engine's slots come with the calibration's
    `sim.workers.max_concurrency`), into `RUN_DIR/replay`. Paths are absolute: it runs anywhere."""
    r = cal["run"]
    run_dir = run_dir.absolute()
    calibration = (calibration or run_dir / CALIBRATION_FILE).absolute()
    env = cal["fit"].get("environment")
    workload = (["workload=multi_turn", *(f"workload.{k}={_arg(v)}" for k, v in env["workload"].items() if k != "name")]
                if env else ["workload=trace", f"workload.path={run_dir / TRACE_FILE}"])
    args = [f"calibration={calibration}", *workload,
            f"policy={r['policy']}", *(f"policy.{k}={_arg(v)}" for k, v in r["policy_params"].items()),
            f"max_staleness={_arg(r['max_staleness'])}", f"batch_groups={r['batch_groups']}",
            f"group_size={r['group_size']}", f"steps={r['steps']}", f"hydra.run.dir={run_dir / REPLAY_DIR}"]
    return " ".join(["python", "-m", "planner.simulate", *map(shlex.quote, args)])


def report(cal: dict[str, Any]) -> str:
    w, t, f = cal["sim"]["workers"], cal["sim"]["trainer"], cal["fit"]
    d, tr, c = f["decode"], f["trainer"], f["colocation"]
    # Which iterations the decode fit holds: on a colocated engine with iterations on both sides of
    # the steps, those outside (the in-step ones fit the slowdown); else every one, in-step included.
    where = (f"outside trainer steps; the {c['lines_in_steps']} in-step lines fit the colocation slowdown"
             if c["fitted"] else f"{d['in_steps']} of them in trainer steps, fitted alike")
    return "\n".join([
        f"decode:  alpha {w['decode_alpha']:.4g} s/step, beta {w['decode_beta']:.4g} s/token, prefill "
        f"{w['prefill_per_token']:.4g} s/token; {w['num_workers']} worker(s), speeds {w['speeds']}, "
        f"{w['max_concurrency']} slots",
        f"         {d['lines']} lines ({where}; {d['left_out']} compiling left out), "
        f"RMS residual {d['rms_s']} s, R² {d['r2']}, total {d['total_error']:+.1%}",
        f"trainer: c0 {t['c0']:.4g} s + c1 {t['c1']:.4g} s/token; {tr['lines']} steps ({tr['left_out']} left out), "
        f"RMS residual {tr['rms_s']} s, R² {tr['r2']}, total {tr['total_error']:+.1%}",
        f"push:    load_lag {w['load_lag']:.4g} s (p10/p50/p90 {f['load_lag_s']['p10_p50_p90']} over "
        f"{f['load_lag_s']['pushes']} loads), t_sync {w['t_sync']:.4g} s, sync_mode {w['sync_mode']}",
        f"colocation: slowdown {w['colocated_slowdown']:.4g} during trainer steps "
        + (f"({c['lines_in_steps']} lines in steps, {c['lines_outside']} outside)" if c["fitted"] else
           f"(not fitted: {'no iterations on both sides of the steps' if c['colocated'] else 'engine on its own devices'})"),
        f"warm-up: compile {w['compile_s']:.4g} s per worker before decoding (compiling lines: "
        f"{f['compile']['decode_lines']}), {t['compile_s']:.4g} s more on the first step (steps left out: "
        f"{f['compile']['trainer_steps']})",
        *tail_report(cal),
        *env_report(cal),
    ])


def env_report(cal: dict[str, Any]) -> list[str]:
    """The environment line of the report, when the trace held multi-turn episodes."""
    e = cal["fit"].get("environment")
    if not e:
        return []
    w = e["workload"]
    tail = (f"Pareto tail {w['env_tail_p']:.3g} of steps from {w['env_tail_scale']:.4g} s, alpha "
            f"{w['env_tail_alpha']:.3g}" if w["env_tail_p"] else "no tail")
    return [f"environment: {e['episodes']} episodes, {e['turns']} turns; turns_mean {w['turns_mean']:.3g} "
            f"(max {w['max_turns']}); latency log-normal mu {w.get('env_mu', 0):.3g} sigma "
            f"{w.get('env_sigma', 0):.3g}, {tail}; timeout {w['env_timeout_s']}; env_fail_p {w['env_fail_p']:.3g}"]


def tail_report(cal: dict[str, Any]) -> list[str]:
    """The speculation and migration lines of the report, when the trace held them."""
    f, w = cal["fit"], cal["sim"]["workers"]
    terms = f.get("tail_terms") or {f"sim.workers.{k}": v for k, v in w.items() if k in ("speculation", "migration_s")}
    out = []
    if "speculation" in f:
        out.append(f"speculation: {f['speculation']['lines']} lines, kept share {f['speculation']['kept_share']}")
    if "migration" in f:
        out.append(f"migration: {f['migration']['moves']} moves")
    if out:
        out.append(f"tail terms: {terms or 'not fitted'}{' (fit.tail_terms, not applied)' if 'tail_terms' in f else ''}")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = entry.ArgumentParser(prog="python -m planner.calibrate", description=__doc__.splitlines()[0])
    ap.add_argument("run_dir", help="a training run's directory (holds trace.jsonl)")
    ap.add_argument("--out", help=f"where to write the calibration (default RUN_DIR/{CALIBRATION_FILE})")
    args = ap.parse_args(argv)
    try:
        cal = calibrate(args.run_dir)
    except (ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    out = Path(args.out) if args.out else Path(args.run_dir) / CALIBRATION_FILE
    if args.out:  # the replay command names the file it reads
        cal["run"]["replay"] = replay_command(Path(args.run_dir), cal, out)
    out.write_text(yaml.safe_dump(cal, sort_keys=False))
    print(report(cal))
    for warning in cal["fit"]["warnings"]:
        print(f"warning: {warning}", file=sys.stderr)
    print(f"wrote {out}")
    print(f"replay: {cal['run']['replay']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
