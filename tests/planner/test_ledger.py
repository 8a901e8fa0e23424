"""The ledger writer and reader: what a kill leaves behind is still readable, and nothing buffered
is on disk before a flush asks for it."""

import pytest

from planner.ledger import LedgerError, LedgerWriter, read_ledger
from planner.types import Admission


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
