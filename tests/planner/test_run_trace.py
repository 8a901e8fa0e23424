"""The run's timing trace (planner/run_trace.py): written buffered, read back line-checked, torn
last lines skipped, engine iterations aggregated into sufficient sums, groups for a replay."""

import json

import pytest

from planner.sim.trace import read_trace
from planner.run_trace import TraceWriter, during_steps, finished_groups, read_run_trace


def write(path, events):
    w = TraceWriter(path)
    for e in events:
        e = dict(e)
        w.write(e.pop("event"), e.pop("t"), **e)
    w.close()


RUN = {"event": "run", "t": 0.0, "step": 0, "group_size": 2, "workers": 1, "slots": 4}


def test_events_come_back_in_order_with_their_fields(tmp_path):
    events = [RUN, {"event": "admit", "t": 0.1, "uid": 0, "attempt": 0, "prompt_id": "p", "prompt_tokens": 5,
                    "version": 0}]
    write(tmp_path / "trace.jsonl", events)
    assert list(read_run_trace(tmp_path / "trace.jsonl")) == events


def test_a_torn_last_line_is_skipped_and_a_torn_middle_line_names_its_line(tmp_path):
    path = tmp_path / "trace.jsonl"
    write(path, [RUN])
    path.write_text(path.read_text() + '{"event": "adm')
    assert [e["event"] for e in read_run_trace(path)] == ["run"]
    path.write_text('{"event": "adm\n' + json.dumps(RUN) + "\n")
    with pytest.raises(ValueError, match=r"trace.jsonl:1: not valid JSON"):
        list(read_run_trace(path))


def test_a_line_missing_a_field_or_an_unknown_event_is_an_error_naming_it(tmp_path):
    path = tmp_path / "trace.jsonl"
    path.write_text(json.dumps({"event": "start", "t": 1.0, "uid": 3, "attempt": 0, "version": 0}) + "\n")
    with pytest.raises(ValueError, match=r":1: start line misses field 'worker'"):
        list(read_run_trace(path))
    path.write_text(json.dumps({"event": "bogus", "t": 1.0}) + "\n")
    with pytest.raises(ValueError, match=r"'event'='bogus': not a run-trace event"):
        list(read_run_trace(path))
    with pytest.raises(ValueError, match="no such trace file"):
        list(read_run_trace(tmp_path / "absent.jsonl"))


def test_decode_lines_sum_iterations_per_worker_and_active_count_with_compiles_and_train_steps_apart(tmp_path):
    w = TraceWriter(tmp_path / "trace.jsonl")
    # (worker, seconds, steps, tokens, prefill tokens, compiled, during a trainer step)
    w.decode(5.0, [(0, 0.1, 8, 64, 10, False, False), (0, 0.3, 8, 62, 0, False, False), (0, 2.0, 8, 64, 0, True, False),
                   (1, 0.2, 4, 16, 0, False, False), (0, 0.5, 8, 64, 0, False, True), (0, 0.7, 8, 64, 0, False, True)])
    w.close()
    lines = list(read_run_trace(tmp_path / "trace.jsonl"))
    assert [(e["worker"], e["active"], e["calls"], e["steps"], e["tokens"], e["prefill_tokens"], e["s"],
             e.get("compile", False), e.get("train", False)) for e in lines] == [
        (0, 8, 2, 16, 126, 10, 0.4, False, False), (0, 8, 2, 16, 128, 0, 1.2, False, True),
        (0, 8, 1, 8, 64, 0, 2.0, True, False), (1, 4, 1, 4, 16, 0, 0.2, False, False)]


def test_an_iteration_is_during_a_step_when_most_of_it_ran_inside_one():
    steps = [(1.0, 2.0), (5.0, 6.0)]
    assert during_steps(1.2, 0.3, steps) and during_steps(5.0, 0.0, steps)
    assert during_steps(0.5, 1.2, steps)  # 0.5 .. 1.7: mostly inside the first step
    assert not during_steps(0.2, 1.0, steps)  # 0.2 .. 1.2: mostly before it
    assert not during_steps(1.9, 0.4, steps)  # ends after the step, most of it outside
    assert not during_steps(3.0, 0.5, steps) and not during_steps(6.0, 0.0, steps) and not during_steps(1.0, 0.5, [])


def test_a_replay_gets_each_finished_group_in_stream_order_with_its_last_attempts_lengths(tmp_path):
    path = tmp_path / "trace.jsonl"
    admit = lambda uid, attempt, t: {"event": "admit", "t": t, "uid": uid, "attempt": attempt,  # noqa: E731
                                     "prompt_id": f"p{uid}", "prompt_tokens": 3 + uid, "version": 0}
    finish = lambda uid, attempt, t, lengths: {"event": "finish", "t": t, "uid": uid, "attempt": attempt,  # noqa: E731
                                               "lengths": lengths}
    write(path, [RUN, admit(1, 0, 0.1), admit(0, 0, 0.2), admit(2, 0, 0.3), finish(1, 0, 0.4, [1, 2]),
                 {"event": "lost", "t": 0.5, "uid": 0, "attempt": 0}, admit(0, 1, 0.6), finish(0, 1, 0.9, [5, 6])])
    groups = finished_groups(list(read_run_trace(path)))
    assert groups == [{"prompt_id": "p0", "prompt_tokens": 3, "lengths": [5, 6]},
                      {"prompt_id": "p1", "prompt_tokens": 4, "lengths": [1, 2]}]  # uid 2 never finished
    # The simulator's workload reader takes the run trace as it is.
    assert [(g.prompt_id, g.lengths, g.prompt_tokens) for g in read_trace(path, group_size=2)] == [
        ("p0", (5, 6), 3), ("p1", (1, 2), 4)]
    with pytest.raises(ValueError, match=r"finished group 0: 'lengths' has 2 entries, group_size=3"):
        read_trace(path, group_size=3)


def test_speculating_iterations_get_lines_of_their_own_with_drafted_and_accepted_at_their_plain_active_count(tmp_path):
    w = TraceWriter(tmp_path / "trace.jsonl")
    # two sequences, 4 steps each: plain (8 tokens), and speculating (16 drafted, 6 kept: 14 tokens)
    w.decode(1.0, [(0, 0.4, 4, 8, 0, False, False), (0, 0.5, 4, 14, 0, False, False, 16, 6),
                   (0, 0.1, 1, 2, 0, False, False, 0, 0)])
    w.close()
    lines = [e for e in read_run_trace(tmp_path / "trace.jsonl")]
    plain = [e for e in lines if "drafted" not in e]
    spec = [e for e in lines if "drafted" in e]
    assert [(e["active"], e["calls"], e["steps"]) for e in plain] == [(2, 2, 5)]  # a plain one is unchanged
    assert [(e["active"], e["tokens"], e["drafted"], e["accepted"]) for e in spec] == [(2, 14, 16, 6)]


def test_the_writer_refuses_a_line_the_schema_does_not_hold_and_writes_nothing_of_it(tmp_path):
    w = TraceWriter(tmp_path / "trace.jsonl")
    with pytest.raises(ValueError, match="declares no 'spec'"):
        w.write("run", 0.0, step=0, group_size=2, workers=1, slots=4, spec={"tokens": 4})
    with pytest.raises(ValueError, match="a finish line misses 'lengths'"):
        w.write("finish", 0.0, uid=0, attempt=0)
    with pytest.raises(ValueError, match="'commit' is not a trace line kind"):
        w.write("commit", 0.0)
    with pytest.raises(ValueError, match="speculation declares no 'k'"):
        w.write("run", 0.0, step=0, group_size=2, workers=1, slots=4, speculation={"k": 4})
    w.close()
    assert (tmp_path / "trace.jsonl").read_text() == ""


def test_a_reader_cannot_read_a_key_its_line_kind_does_not_declare(tmp_path):
    write(tmp_path / "trace.jsonl", [{**RUN, "speculation": {"when": "always", "tokens": 4}},
                                     {"event": "decode", "t": 1.0, "worker": 0, "active": 1, "calls": 1, "steps": 2,
                                      "tokens": 3, "prefill_tokens": 0, "s": 0.1}])
    run, decode = read_run_trace(tmp_path / "trace.jsonl")
    assert run["speculation"]["tokens"] == 4 and run.get("kv_tokens") is None  # declared, absent: None
    assert decode.get("drafted") is None and "compile" not in decode
    with pytest.raises(KeyError, match="'uid': not a key of a trace decode line"):
        decode.get("uid")
    with pytest.raises(KeyError, match="'k': not a key of a trace run.speculation line"):
        run["speculation"].get("k")
