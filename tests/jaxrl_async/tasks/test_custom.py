"""The custom task: prompts from the user's JSONL file, exact-match reward."""

import pytest

from jaxrl_async.tasks import build_task
from tests.helpers.tasks import score


def test_custom_reads_prompts_scores_exact_match_and_needs_a_path(tmp_path):
    path = tmp_path / "mine.jsonl"
    path.write_text('{"prompt": "say hi", "answer": "hi", "lang": "en"}\n\n{"prompt": "no answer"}\n')
    task = build_task({"name": "custom", "path": str(path)})
    examples = task.examples()
    assert [e.prompt_id for e in examples] == ["custom-mine-1", "custom-mine-3"]
    assert examples[0].meta == {"lang": "en"} and examples[1].answer is None
    assert score(task, "hi", " hi\n") == 1.0 and score(task, "hi", "hello") == 0.0
    with pytest.raises(ValueError, match="task 'custom' needs a JSONL file"):
        build_task({"name": "custom"})


def test_the_held_out_split_is_its_own_file_and_its_absence_is_one_line(tmp_path):
    (tmp_path / "train.jsonl").write_text('{"prompt": "a", "answer": "1"}\n')
    (tmp_path / "test.jsonl").write_text('{"prompt": "b", "answer": "2"}\n{"prompt": "c", "answer": "3"}\n')
    task = build_task({"name": "custom", "path": str(tmp_path / "train.jsonl"), "test_path": str(tmp_path / "test.jsonl")})
    assert [e.content for e in task.split_examples("test")] == ["b", "c"]
    assert [e.content for e in task.split_examples("train")] == ["a"]
    with pytest.raises(ValueError, match="task.test_path=None: split=test needs a held-out JSONL"):
        build_task({"name": "custom", "path": str(tmp_path / "train.jsonl")}).test_examples()
