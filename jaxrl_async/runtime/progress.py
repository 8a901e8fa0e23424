"""The live progress display: a rich panel on a terminal, one plain line per step otherwise.

It is a `MetricsSink`: it reads the same per-step record as `metrics.jsonl`, plus the run-so-far
keys the controller adds for it (`staleness_hist`, `trainer_busy`, `generator_busy`, `eta_s`),
and the held-out figures (`eval/pass_at_1`, `eval/version`) of the records that carry them. With
speculation or migration on (`speculation`, `migration`), what they did so far (the records'
`speculation_*` and `groups_migrated`, metrics.py `tail_counts`): a mechanism that is on shows its
counts even when they are 0, since a tail feature that does nothing must not look like one that works.

The first step of a run includes compiling the engine and the train step (tens of seconds, 10–20
step times), so until it ends the display says so — a panel status, or one plain line at start —
and the ETA (`Eta`) is measured from the end of the first step: it is null (shown "–") at the
first step and then counts no compile.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any, TextIO

STARTING = "starting: compiling the engine and the train step (the first step includes it)…"


def _duration(seconds: float) -> str:
    seconds = max(0, int(seconds))
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s"


def _eta_text(seconds: float | None) -> str:
    return "–" if seconds is None else _duration(seconds)


class Eta:
    """Seconds left in the run, from the steps after the first one of this run segment.

    The controller calls `step_done(steps_done, now)` at every step record (`now`: any clock in
    seconds; the controller's monotonic one). The first call (a run's, or a resumed segment's
    first step) holds the compile and returns None; later ones extrapolate the time per step
    since then.
    """

    def __init__(self, total_steps: int) -> None:
        self.total_steps = total_steps
        self._first: tuple[int, float] | None = None  # (steps done, time) at the segment's first step

    def step_done(self, steps_done: int, now: float) -> float | None:
        if self._first is None:
            self._first = (steps_done, now)
            return None
        steps0, t0 = self._first
        return (self.total_steps - steps_done) * (now - t0) / max(1, steps_done - steps0)


def _hist_text(hist: dict[str, int]) -> str:
    total = sum(hist.values()) or 1
    return " ".join(f"{s}:{100 * t / total:.0f}%" for s, t in sorted(hist.items(), key=lambda kv: int(kv[0])))


def tail_text(r: Mapping[str, Any], *, speculation: bool, migration: bool) -> str:
    """"drafted 120 tokens in 40 sequence-iterations, accepted 80 (67%); migrated 3 groups": the
    tail's counts (a step record's or summary.json's, metrics.py `tail_counts`) of the features
    that are on; "" when none is."""
    parts = []
    if speculation:
        drafted, accepted = r.get("speculation_drafted_tokens"), r.get("speculation_accepted_tokens")
        if drafted is None:
            parts.append("speculation not counted (the engine reports no iterations)")
        else:
            rate = f" ({100 * accepted / drafted:.0f}%)" if drafted else ""
            parts.append(f"drafted {drafted} tokens in {r.get('speculating_sequences')} sequence-iterations, "
                         f"accepted {accepted}{rate}")
    if migration:
        parts.append(f"migrated {r.get('groups_migrated', 0)} groups")
    return "; ".join(parts)


class ProgressDisplay:
    """`mode`: "rich" (live panel), "plain" (a line per step) or "auto" (rich on a TTY).
    `speculation`, `migration`: the tail's features that are on (their counts are shown)."""

    def __init__(self, *, total_steps: int, policy: str, max_staleness: int | None, mode: str = "auto",
                 stream: TextIO | None = None, speculation: bool = False, migration: bool = False) -> None:
        self.total_steps = total_steps
        self.tail = {"speculation": speculation, "migration": migration}
        self.title = f"jaxrl-async · policy={policy} · η={'∞' if max_staleness is None else max_staleness}"
        self.stream = stream or sys.stdout
        if mode == "auto":
            mode = "rich" if self.stream.isatty() else "plain"
        self.mode = mode
        self._rewards: list[float] = []
        self._evals: list[tuple[int, float]] = []  # (weights version, held-out pass@1), the run so far
        self._live = None
        if mode == "plain":
            print(STARTING, file=self.stream, flush=True)
        elif mode == "rich":
            from rich.console import Console
            from rich.live import Live

            self._live = Live(self._panel(None), console=Console(file=self.stream), refresh_per_second=4)
            self._live.start()

    def write(self, record: dict[str, Any]) -> None:
        if record.get("reward_mean") is not None:
            self._rewards.append(float(record["reward_mean"]))
        if record.get("eval/pass_at_1") is not None:
            self._evals.append((int(record["eval/version"]), float(record["eval/pass_at_1"])))
        if self._live is not None:
            self._live.update(self._panel(record))
        elif self.mode == "plain":
            print(self._line(record), file=self.stream, flush=True)

    def close(self) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None

    def _line(self, r: dict[str, Any]) -> str:
        skipped = " SKIPPED(non-finite loss)" if r.get("skipped") else ""
        held_out = (f" eval(v{r['eval/version']}) pass@1 {r['eval/pass_at_1']:.3f}"
                    if r.get("eval/pass_at_1") is not None else "")
        tail = tail_text(r, **self.tail)
        return (f"step {r['step'] + 1}/{self.total_steps} reward {r['reward_mean']:.3f} loss {r['loss']:.4f} "
                f"stale(max) {r['max_staleness_in_batch']} hist [{_hist_text(r['staleness_hist'])}] "
                f"gen {100 * r['generator_busy']:.0f}% train {100 * r['trainer_busy']:.0f}% "
                f"{r['tokens_per_s']:.0f} tok/s ETA {_eta_text(r['eta_s'])}{held_out}"
                f"{f' tail: {tail}' if tail else ''}{skipped}")

    def _panel(self, r: dict[str, Any] | None):
        from rich.panel import Panel
        from rich.table import Table

        table = Table.grid(padding=(0, 2))
        table.add_column(style="bold cyan")
        table.add_column()
        if r is None:
            table.add_row("status", STARTING)
            return Panel(table, title=self.title)
        recent = self._rewards[-5:]
        table.add_row("step", f"{r['step'] + 1} / {self.total_steps}")
        table.add_row("reward", f"{r['reward_mean']:.3f} (last {len(recent)}: {sum(recent) / len(recent):.3f}, "
                                f"first: {self._rewards[0]:.3f})")
        table.add_row("loss", f"{r['loss']:.4f}" + ("  [red]step skipped: non-finite loss[/red]" if r.get("skipped") else ""))
        hist = r["staleness_hist"]
        total = sum(hist.values()) or 1
        bars = "\n".join(f"{s}: {'█' * max(1, round(30 * t / total)) if t else ''} {t}"
                         for s, t in sorted(hist.items(), key=lambda kv: int(kv[0])))
        table.add_row("staleness\n(tokens)", bars or "–")
        table.add_row("busy", f"generator {100 * r['generator_busy']:.0f}%  trainer {100 * r['trainer_busy']:.0f}%")
        table.add_row("throughput", f"{r['tokens_per_s']:.0f} tokens/s")
        tail = tail_text(r, **self.tail)
        if tail:
            table.add_row("tail", tail)
        if self._evals:
            (v0, p0), (v, p) = self._evals[0], self._evals[-1]
            table.add_row("eval pass@1", f"{p:.3f} (weights v{v}; first: {p0:.3f} at v{v0})")
        table.add_row("elapsed / ETA", f"{_duration(r['elapsed_s'])} / {_eta_text(r['eta_s'])}")
        return Panel(table, title=self.title)
