"""The live progress display: a rich panel on a terminal, one plain line per step otherwise.

It is a `MetricsSink`: it reads the same per-step record as `metrics.jsonl`, plus the run-so-far
keys the controller adds for it (`staleness_hist`, `trainer_busy`, `generator_busy`, `eta_s`).
"""

from __future__ import annotations

import sys
from typing import Any, TextIO


def _duration(seconds: float) -> str:
    seconds = max(0, int(seconds))
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s"


def _hist_text(hist: dict[str, int]) -> str:
    total = sum(hist.values()) or 1
    return " ".join(f"{s}:{100 * t / total:.0f}%" for s, t in sorted(hist.items(), key=lambda kv: int(kv[0])))


class ProgressDisplay:
    """`mode`: "rich" (live panel), "plain" (a line per step) or "auto" (rich on a TTY)."""

    def __init__(self, *, total_steps: int, policy: str, max_staleness: int | None, mode: str = "auto",
                 stream: TextIO | None = None) -> None:
        self.total_steps = total_steps
        self.title = f"jaxrl-async · policy={policy} · η={'∞' if max_staleness is None else max_staleness}"
        self.stream = stream or sys.stdout
        if mode == "auto":
            mode = "rich" if self.stream.isatty() else "plain"
        self.mode = mode
        self._rewards: list[float] = []
        self._live = None
        if mode == "rich":
            from rich.console import Console
            from rich.live import Live

            self._live = Live(self._panel(None), console=Console(file=self.stream), refresh_per_second=4)
            self._live.start()

    def write(self, record: dict[str, Any]) -> None:
        if record.get("reward_mean") is not None:
            self._rewards.append(float(record["reward_mean"]))
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
        return (f"step {r['step'] + 1}/{self.total_steps} reward {r['reward_mean']:.3f} loss {r['loss']:.4f} "
                f"stale(max) {r['max_staleness_in_batch']} hist [{_hist_text(r['staleness_hist'])}] "
                f"gen {100 * r['generator_busy']:.0f}% train {100 * r['trainer_busy']:.0f}% "
                f"{r['tokens_per_s']:.0f} tok/s ETA {_duration(r['eta_s'])}{skipped}")

    def _panel(self, r: dict[str, Any] | None):
        from rich.panel import Panel
        from rich.table import Table

        table = Table.grid(padding=(0, 2))
        table.add_column(style="bold cyan")
        table.add_column()
        if r is None:
            table.add_row("status", "starting (compiling the engine and the train step)…")
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
        table.add_row("elapsed / ETA", f"{_duration(r['elapsed_s'])} / {_duration(r['eta_s'])}")
        return Panel(table, title=self.title)
