"""The ledger's writer and reader: the exact lines docs/design.md §8 specifies, buffering that
loses nothing on flush/close (and writes nothing before a flush asks for it), append mode for a
resumed run, and a reader that names the file and line of anything malformed but skips the torn
last line a kill leaves behind."""

from __future__ import annotations

import json

import pytest

from planner.ledger import LEDGER_FILE, LedgerError, LedgerWriter, read_ledger
from planner.types import Admission, Drop, Move


def lines(path) -> list[str]:
    return path.read_text().splitlines()


def test_every_event_is_one_compact_json_line_in_the_documented_shape(tmp_path):
    path = tmp_path / "runs" / "a" / LEDGER_FILE  # the run directory is created, parents too
    with LedgerWriter(path) as w:
        w.admit(Admission(3, "p", 1, 4, priority=4.0, planned_step=2))
        w.admit(Admission(4, "q", 0))
        w.start(3, 2)
        w.train(5, [(3, [(1, 2), (2, 7)]), (4, [])])
        w.drop(Drop(4, 5, "end_of_run"), tokens=9)
        w.drop(Drop(5, 6, "stale"))
        w.drop(Drop(8, 6, "stale"), tokens=3, length=40)  # the simulator knows the true length
        w.moves([Move(6, 1, 2), Move(7, -1, 3)])
    assert lines(path) == [
        '{"event":"admit","uid":3,"version":1,"deadline":4,"prompt":"p"}',
        '{"event":"admit","uid":4,"version":0,"deadline":null,"prompt":"q"}',
        '{"event":"start","uid":3,"version":2}',
        '{"event":"train","step":5,"groups":[{"uid":3,"versions":[[1,2],[2,7]]},{"uid":4,"versions":[]}]}',
        '{"event":"drop","uid":4,"step":5,"reason":"end_of_run","tokens":9}',
        '{"event":"drop","uid":5,"step":6,"reason":"stale","tokens":0}',
        '{"event":"drop","uid":8,"step":6,"reason":"stale","tokens":3,"length":40}',
        '{"event":"move","uid":6,"from":1,"to":2}',
        '{"event":"move","uid":7,"from":-1,"to":3}',
    ]


def test_lines_are_buffered_until_the_buffer_fills_or_a_flush_and_none_is_lost(tmp_path):
    path = tmp_path / LEDGER_FILE
    w = LedgerWriter(path, buffer_lines=3)
    w.start(0, 0)
    w.start(1, 0)
    assert path.read_text() == ""  # two lines wait in the buffer
    w.start(2, 0)  # the third fills it
    assert [json.loads(x)["uid"] for x in lines(path)] == [0, 1, 2]
    w.start(3, 0)
    w.flush()
    w.flush()  # an empty flush writes nothing more
    assert [json.loads(x)["uid"] for x in lines(path)] == [0, 1, 2, 3]
    w.start(4, 0)
    w.close()
    assert [json.loads(x)["uid"] for x in lines(path)] == [0, 1, 2, 3, 4]
    assert path.read_text().endswith("}\n")


def test_a_new_writer_starts_the_file_afresh_and_an_appending_one_continues_it(tmp_path):
    path = tmp_path / LEDGER_FILE
    with LedgerWriter(path) as w:
        w.start(0, 0)
    with LedgerWriter(path, append=True) as w:
        w.start(1, 0)
    assert [json.loads(x)["uid"] for x in lines(path)] == [0, 1]
    with LedgerWriter(path) as w:
        w.start(2, 0)
    assert [json.loads(x)["uid"] for x in lines(path)] == [2]


def test_the_reader_yields_events_with_their_line_numbers_and_skips_blank_lines(tmp_path):
    path = tmp_path / LEDGER_FILE
    path.write_text('{"event":"start","uid":1,"version":0}\n\n   \n{"event":"move","uid":1,"from":0,"to":1}\n')
    assert list(read_ledger(path)) == [
        {"event": "start", "uid": 1, "version": 0, "_line": 1},
        {"event": "move", "uid": 1, "from": 0, "to": 1, "_line": 4},
    ]
    assert list(read_ledger(str(path)))[1]["_line"] == 4  # a str path works too


@pytest.mark.parametrize("text,message", [
    ('{"event":"start"}\n{"event": \n', r":2: not valid JSON \(Expecting value\)"),
    ('{"event":"start"}\n[1, 2]\n', ":2: missing field 'event'"),
    ('{"uid": 1}\n', ":1: missing field 'event'"),
])
def test_a_malformed_line_is_an_error_naming_the_file_and_line(tmp_path, text, message):
    path = tmp_path / LEDGER_FILE
    path.write_text(text)
    with pytest.raises(LedgerError, match=message) as info:
        list(read_ledger(path))
    assert str(info.value).startswith(f"{path}:") and "\n" not in str(info.value)
    if "JSON" in message:  # one line for the user: the decoder's traceback is not chained
        assert info.value.__cause__ is None and info.value.__suppress_context__


def admission(uid: int) -> Admission:
    return Admission(uid=uid, prompt_id=f"p{uid}", version=0, deadline=1, priority=1.0)


def test_buffered_lines_reach_the_file_only_when_flushed(tmp_path):
    path = tmp_path / "ledger.jsonl"
    writer = LedgerWriter(path, buffer_lines=100)
    writer.admit(admission(0))
    writer.start(0, 0)
    assert path.read_text() == ""  # a SIGKILL now loses both: the runtime flushes at step ends
    writer.flush(sync=True)
    events = list(read_ledger(path))
    assert [e["event"] for e in events] == ["admit", "start"]
    assert events[0]["prompt"] == "p0"
    writer.close()


def test_a_torn_last_line_is_skipped(tmp_path):
    path = tmp_path / "ledger.jsonl"
    with LedgerWriter(path) as writer:
        writer.admit(admission(0))
        writer.admit(admission(1))
    whole = path.read_text()
    path.write_text(whole[:-7])  # a kill in the middle of the second line's write
    assert [e["uid"] for e in read_ledger(path)] == [0]


def test_a_malformed_line_in_the_middle_is_still_an_error(tmp_path):
    path = tmp_path / "ledger.jsonl"
    with LedgerWriter(path) as writer:
        writer.admit(admission(0))
    path.write_text('{"event": "adm\n' + path.read_text())
    with pytest.raises(LedgerError, match=r"ledger.jsonl:1: not valid JSON"):
        list(read_ledger(path))
    path.write_text(path.read_text() + '{"event": "adm\n')  # a complete line (with its newline) is no tear
    with pytest.raises(LedgerError, match=r"ledger.jsonl:1: not valid JSON"):
        list(read_ledger(path))
