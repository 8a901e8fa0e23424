import pytest

from planner.sim.trace import TraceGroup, read_trace, write_trace


def write(tmp_path, text):
    path = tmp_path / "trace.jsonl"
    path.write_text(text)
    return path


def test_a_trace_round_trips_through_write_and_read(tmp_path):
    groups = [TraceGroup(0, (3, 4)), TraceGroup("p1", (5, 0), prompt_tokens=7)]
    write_trace(tmp_path / "t.jsonl", groups)
    assert read_trace(tmp_path / "t.jsonl", group_size=2) == groups


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ('{"prompt_id": 1, "lengths": [1, 2]}\n{"prompt_id": 2}\n', ":2: missing field 'lengths'"),
        ('{"prompt_id": 1, "lengths": [1, -2]}\n', ":1: 'lengths' holds -2"),
        ('{"prompt_id": 1, "lengths": [1, 2]}\nnot json\n', ":2: not valid JSON"),
        ('{"prompt_id": 1, "lengths": []}\n', ":1: 'lengths' must be a non-empty list"),
        ('{"prompt_id": 1, "lengths": [1, 2], "prompt_tokens": -1}\n', ":1: 'prompt_tokens'=-1"),
        ('{"prompt_id": 1, "lengths": [1, 2]}\n{"prompt_id": 2, "lengths": [1, 100000000000000000000]}\n',
         ":2: 'lengths' holds 100000000000000000000: lengths must be <= 2147483647"),
        ('{"prompt_id": 1, "lengths": [1, 2], "prompt_tokens": 100000000000000000000}\n',
         ":1: 'prompt_tokens'=100000000000000000000: must be an integer in [0, 2147483647]"),
        ('{"prompt_id": 1, "lengths": [1, 2, 3]}\n', ":1: 'lengths' has 3 entries, group_size=2"),
        ("\n\n", "the trace holds no groups"),
    ],
)
def test_a_malformed_trace_names_file_and_line(tmp_path, text, needle):
    path = write(tmp_path, text)
    with pytest.raises(ValueError) as e:
        read_trace(path, group_size=2)
    assert str(path) in str(e.value) and needle in str(e.value)


def test_the_largest_length_is_accepted(tmp_path):
    path = write(tmp_path, '{"prompt_id": 1, "lengths": [2147483647, 0], "prompt_tokens": 2147483647}\n')
    assert read_trace(path, group_size=2) == [TraceGroup(1, (2147483647, 0), prompt_tokens=2147483647)]


def test_a_missing_trace_file_names_the_field(tmp_path):
    with pytest.raises(ValueError, match="workload.path="):
        read_trace(tmp_path / "absent.jsonl")
