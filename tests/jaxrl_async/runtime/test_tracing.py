"""The controller's trace writer (runtime/tracing.py): events at run time, the `train` line at the
hand-over, engine iterations inside a step marked `train`, and nothing written without a trace;
and the trace's schema (planner/run_trace.py LINES) held to what a real run writes."""

import dataclasses
import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from jaxrl_async.engines.base import EngineTiming
from jaxrl_async.engines.speculation import SpeculationConfig
from jaxrl_async.runtime.tracing import RunTracer
from planner.run_trace import LINES, SECTIONS, TRACE_FILE, TraceWriter, read_run_trace
from planner.tools.calibrate import calibrate
from tests.helpers.train_runs import make_job, run_within


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def group(prompt_tokens: int, lengths: list[int]):
    samples = [SimpleNamespace(token_ids=[7] * n) for n in lengths]
    return SimpleNamespace(prompt_ids=[1] * prompt_tokens, samples=samples)


def tracer(tmp_path):
    clock = Clock()
    return RunTracer(TraceWriter(tmp_path / TRACE_FILE, append=False), clock), clock


def lines(tmp_path, t: RunTracer) -> list[dict]:
    t.flush()
    return list(read_run_trace(tmp_path / TRACE_FILE))


def test_an_event_is_written_at_the_clocks_run_time_with_its_fields(tmp_path):
    t, clock = tracer(tmp_path)
    clock.t = 1.25
    t.event("admit", uid=3, attempt=0, prompt_id="p", prompt_tokens=4, version=0)
    assert lines(tmp_path, t) == [{"event": "admit", "t": 1.25, "uid": 3, "attempt": 0, "prompt_id": "p",
                                   "prompt_tokens": 4, "version": 0}]


def test_a_steps_train_line_is_dated_at_its_hand_over_with_its_token_counts(tmp_path):
    t, clock = tracer(tmp_path)
    clock.t = 2.0
    t.handed_over()
    clock.t = 5.0
    t.step_trained(0, [group(3, [2, 4]), group(5, [1, 1])], start_s=2.5, train_s=2.0)
    assert lines(tmp_path, t) == [{"event": "train", "t": 2.0, "step": 0, "start": 2.5, "end": 4.5, "groups": 2,
                                   "tokens": 8, "prompt_tokens": 16}]


def test_engine_iterations_inside_a_steps_window_are_marked_train_and_loads_dated_by_the_engine_clock(tmp_path):
    t, clock = tracer(tmp_path)
    clock.t = 10.0
    t.handed_over()
    clock.t = 20.0
    t.step_trained(0, [group(1, [1])], start_s=10.0, train_s=9.0)  # window (10, 20) in run seconds
    clock.t = 30.0
    timings = [EngineTiming("decode", 0, t=114.0, seconds=2.0, steps=4, tokens=8),  # run 14-16: inside the step
               EngineTiming("decode", 0, t=124.0, seconds=2.0, steps=4, tokens=8),  # run 24-26: after it
               EngineTiming("load", 0, t=121.0, seconds=0.5, version=1)]
    t.engine(timings, run_s=lambda mono: mono - 100.0)
    out = [e for e in lines(tmp_path, t) if e["event"] != "train"]
    assert out[0] == {"event": "load", "t": 21.0, "version": 1, "worker": 0, "s": 0.5}
    decode = [e for e in out if e["event"] == "decode"]
    assert [(e.get("train", False), e["calls"], e["t"]) for e in decode] == [(False, 1, 30.0), (True, 1, 30.0)]
    t.engine([EngineTiming("decode", 0, t=115.0, seconds=2.0, steps=4, tokens=8)], run_s=lambda mono: mono - 100.0)
    assert not lines(tmp_path, t)[-1].get("train")  # the windows were drained with the first timings


def test_an_engines_drafted_and_accepted_tokens_reach_the_trace(tmp_path):
    t, clock = tracer(tmp_path)
    clock.t = 5.0
    t.engine([EngineTiming("decode", 0, t=101.0, seconds=1.0, steps=4, tokens=11, drafted=12, accepted=3)],
             run_s=lambda mono: mono - 100.0)
    decode = [e for e in lines(tmp_path, t) if e["event"] == "decode"]
    assert [(e["active"], e["drafted"], e["accepted"]) for e in decode] == [(2, 12, 3)]


def test_without_a_trace_nothing_is_written_and_the_steps_windows_do_not_pile_up(tmp_path):
    clock = Clock()
    t = RunTracer(None, clock)
    t.event("admit", uid=1)
    t.handed_over()
    t.step_trained(0, [group(1, [1])], start_s=0.0, train_s=1.0)
    t.engine([EngineTiming("decode", 0, t=0.5, seconds=0.1, steps=1, tokens=1)], run_s=float)
    t.flush(sync=True)
    assert not t.enabled and t._train_windows == [] and not (tmp_path / TRACE_FILE).exists()


# ---------------------------------------------------------------- the schema, held to the writers
REPO = Path(__file__).resolve().parents[3]
# Line kinds the runtime does not write, each with the reason; a kind written since fails the test
# below until it is taken off this list.
NOT_WRITTEN = {"migrate": "the runtime traces no migration yet: calibrate's migration_s comes from hand-written traces"}


def test_every_line_kind_of_the_schema_is_written_by_the_runtime():
    """A reader reads a kind's required keys only from lines the writer checked against the schema
    (`TraceWriter.write`), so what is left to hold is that each kind has a writer at all."""
    written = set()
    for path in (REPO / "jaxrl_async").rglob("*.py"):
        text = path.read_text()
        written |= set(re.findall(r"\.(?:event|write)\(\s*\"(\w+)\"", text))
        written |= {"decode"} if re.search(r"\.decode\(self\.clock\(\)", text) else set()
    assert set(LINES) - written == set(NOT_WRITTEN)


def test_the_run_lines_speculation_section_is_the_engines_speculation_config():
    assert set(SECTIONS[("run", "speculation")].optional) == {f.name for f in dataclasses.fields(SpeculationConfig)}


# Up to 8 sequences active (2 groups of 2, a window of 2 batches): the crowded iterations stay plain
# (more than max_active=5) and the last ones of a batch speculate, so the fit has both to compare.
SPECULATING_RUN = ["steps=4", "batch_groups=2", "group_size=2", "max_new_tokens=16", "checkpoint_every=0",
                   "engine.speculation.when=always", "engine.speculation.method=draft",
                   "engine.speculation.draft_model=layers:1", "engine.speculation.tokens=3",
                   "engine.speculation.max_active=5"]


@pytest.mark.slow
def test_a_real_speculating_runs_trace_holds_every_key_a_reader_may_take_and_calibrates_the_acceptance(tmp_path):
    """Every optional key of the schema — the speculating engine's config on the run line, the
    compiling, in-step and speculating decode lines — appears in a short real run's trace (required
    keys are held by the writer itself), so a reader's `.get` of a declared key is never always None;
    and calibration, the reader that needs the run line's `speculation.tokens`, fits the acceptance."""
    summary = run_within(make_job(tmp_path / "run", SPECULATING_RUN), 600)
    assert summary["audit_ok"]
    events = list(read_run_trace(tmp_path / "run" / TRACE_FILE))
    for kind, keys in LINES.items():
        lines = [dict(e) for e in events if e["event"] == kind]
        # A fault-free run of a no-drop policy on a single-turn task: no lost, drop or episode line
        # (tests/jaxrl_async/envs/test_runtime.py holds a multi-turn run's episode lines).
        if kind in NOT_WRITTEN or kind in ("lost", "drop", "episode"):
            continue
        assert lines, f"no {kind} line"
        present = set().union(*lines)
        # Whether an iteration of this short run overlaps a train step (decode's `train`) is a race
        # of the two threads: test_engine_iterations_inside_a_steps_window_are_marked_train... pins
        # that the writer writes it.
        racy = {"train"} if kind == "decode" else set()
        # A speculating engine never pins adapters (engine.adapter_versions > 1 refuses speculation):
        # tests/jaxrl_async/job/test_adapter_versions_run.py holds a pinned run's run line to it.
        racy |= {"adapter_versions"} if kind == "run" else set()
        assert set(keys.optional) - racy <= present, f"{kind} lines never carry {sorted(set(keys.optional) - present)}"
    (run,) = [e for e in events if e["event"] == "run"]
    assert dict(run["speculation"]) == {"when": "always", "method": "draft", "tokens": 3, "draft_model": "layers:1",
                                        "ngram": 2, "max_active": 5}
    fitted = calibrate(tmp_path / "run")["sim"]["workers"]["speculation"]
    assert fitted["tokens"] == 3 and 0 <= fitted["acceptance"] <= 1
