"""gsm8k: JSONL parsing with FILE:LINE errors, prompts, and the math-verify reward."""

import asyncio
import shutil

import pytest

from jaxrl_async.tasks import build_task
from jaxrl_async.tasks.gsm8k import SAMPLE_PATH, final_answer
from jaxrl_async.tokenizer import tiny_tokenizer
from tests.helpers import REPO

TEST_SAMPLE = REPO / "tests" / "data" / "gsm8k_sample.jsonl"


def _reward(task, prompt, completion):
    return asyncio.run(task.reward(prompt, completion, []))


def test_the_packaged_sample_is_the_test_sample_and_is_the_default():
    assert SAMPLE_PATH.read_text() == TEST_SAMPLE.read_text()
    examples = build_task({"name": "gsm8k"}).examples()
    assert len(examples) == 8 and examples[0].prompt_id == "gsm8k-gsm8k_sample-1"
    assert [e.answer for e in examples] == ["19", "15", "252", "40", "52", "2100", "65", "12"]


def test_the_final_answer_is_after_the_last_marker_without_thousands_separators():
    assert final_answer("work #### 1,234 ") == "1234"
    assert final_answer("no marker") is None and final_answer("empty ####  ") is None


def test_prompts_hold_the_question_and_the_boxed_instruction_in_the_chat_template():
    tok = tiny_tokenizer()
    prompt = next(build_task({"name": "gsm8k"}).make_stream(tok, tok.chat_template, seed=0, shuffle=False))
    assert prompt.text.startswith("<|im_start|>user\nMia has 7 apples.")
    assert prompt.text.endswith("within \\boxed{}.<|im_end|>\n<|im_start|>assistant\n")
    assert prompt.answer == "19"


@pytest.mark.parametrize("completion, expected", [
    ("So the answer is \\boxed{19}.", 1.0),
    ("3*4=12, 7+12=19. \\boxed{19.0}", 1.0),
    ("The answer is \\boxed{18}.", 0.0),
    ("I am not sure.", 0.0),
    ("", 0.0),
])
def test_math_verify_rewards_a_right_final_answer_only(completion, expected):
    task = build_task({"name": "gsm8k"})
    prompt = next(task.make_stream(tiny_tokenizer(), None, seed=0, shuffle=False))
    result = _reward(task, prompt, completion)
    assert (result.value, result.error) == (expected, None)


def test_thousands_in_the_gold_answer_still_verify():
    task = build_task({"name": "gsm8k"})
    stream = task.make_stream(tiny_tokenizer(), None, seed=0, shuffle=False)
    prompt = [next(stream) for _ in range(6)][-1]
    assert prompt.answer == "2100" and _reward(task, prompt, "\\boxed{2100}").value == 1.0


@pytest.mark.parametrize("bad_line, message", [
    ('{"question": "q?"}', r"bad.jsonl:3: missing field 'answer'"),
    ('{"question": "q?", "answer": "no final"}', r"bad.jsonl:3: field 'answer' has no '#### <final answer>'"),
    ("{not json", r"bad.jsonl:3: not valid JSON"),
    ('["question"]', r"bad.jsonl:3: must be a JSON object"),
    ('{"question": 7, "answer": "#### 7"}', r"bad.jsonl:3: field 'question'=7 has the wrong type"),
])
def test_a_bad_line_fails_when_the_stream_is_built_naming_file_and_line(tmp_path, bad_line, message):
    path = tmp_path / "bad.jsonl"
    shutil.copy(TEST_SAMPLE, path)
    lines = path.read_text().splitlines()
    path.write_text("\n".join(lines[:2] + [bad_line] + lines[2:]) + "\n")
    task = build_task({"name": "gsm8k", "path": str(path)})  # the data is read at stream build
    with pytest.raises(ValueError, match=message) as info:
        task.make_stream(tiny_tokenizer(), None, seed=0)
    assert "\n" not in str(info.value)


def test_a_missing_file_is_named():
    with pytest.raises(ValueError, match="task.path='/nonexistent.jsonl': no such file"):
        build_task({"name": "gsm8k", "path": "/nonexistent.jsonl"}).make_stream(tiny_tokenizer(), None, seed=0)
