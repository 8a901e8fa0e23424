"""PromptStream: determinism, resume from a state dict, epochs and shuffling."""

import json

import pytest

from jaxrl_async.tasks import build_task
from jaxrl_async.tokenizer import tiny_tokenizer


def _stream(num_prompts=6, **kwargs):
    task = build_task({"name": "repeat_letter", "alphabet": "abcdef", "num_prompts": num_prompts})
    tok = tiny_tokenizer()
    return task.make_stream(tok, tok.chat_template, **kwargs)


def _ids(stream, n):
    return [next(stream).prompt_id for _ in range(n)]


def test_the_same_seed_gives_the_same_prompts_and_another_seed_another_order():
    a, b, c = _stream(seed=1), _stream(seed=1), _stream(seed=2)
    first = _ids(a, 12)
    assert first == _ids(b, 12)
    assert first != _ids(c, 12)


def test_each_epoch_is_a_permutation_of_the_data_reshuffled_every_epoch():
    stream = _stream(seed=3)
    epochs = [_ids(stream, 6) for _ in range(3)]
    expected = sorted(f"repeat_letter-{i}" for i in range(6))
    assert all(sorted(e) == expected for e in epochs)
    assert len({tuple(e) for e in epochs}) > 1


def test_without_shuffle_the_stream_keeps_file_order():
    assert _ids(_stream(seed=0, shuffle=False), 8) == [f"repeat_letter-{i}" for i in (0, 1, 2, 3, 4, 5, 0, 1)]


def test_a_finite_stream_stops_after_its_epochs_and_reports_the_epoch():
    stream = _stream(seed=0, num_epochs=2)
    assert stream.epoch == 0
    _ids(stream, 7)
    assert stream.epoch == 1 and stream.position == 7
    assert len(list(stream)) == 5
    assert stream.epoch == 2


def test_resuming_from_a_json_round_tripped_state_gives_exactly_the_following_prompts():
    stream = _stream(seed=5)
    _ids(stream, 9)  # mid-way through the second epoch
    state = json.loads(json.dumps(stream.state_dict()))
    expected = [next(stream) for _ in range(10)]
    resumed = _stream(seed=5)
    resumed.load_state_dict(state)
    assert resumed.epoch == 1
    got = [next(resumed) for _ in range(10)]
    assert got == expected


def test_a_state_from_other_data_or_another_seed_is_refused():
    state = _stream(seed=5).state_dict()
    with pytest.raises(ValueError, match="seed=5 but this stream has seed=6"):
        _stream(seed=6).load_state_dict(state)
    with pytest.raises(ValueError, match="num_examples=6 but this stream has num_examples=7"):
        _stream(num_prompts=7, seed=5).load_state_dict(state)
    with pytest.raises(ValueError, match="next_index=99"):
        _stream(seed=5, num_epochs=2).load_state_dict({**state, "next_index": 99})


def test_prompts_are_the_chat_template_applied_and_tokenized():
    prompt = next(_stream(seed=0, shuffle=False))
    tok = tiny_tokenizer()
    assert prompt.text == "<|im_start|>user\naaaaaaaa<|im_end|>\n<|im_start|>assistant\n"
    assert prompt.prompt_ids == tok.encode(prompt.text, add_bos=False)
    assert prompt.prompt_ids[0] == tok.token_to_id("<|im_start|>")
    assert prompt.meta["content"] == "aaaaaaaa" and prompt.answer == "a"


def test_without_a_chat_template_the_raw_content_is_the_prompt():
    task = build_task({"name": "copy_string"})
    prompt = next(task.make_stream(tiny_tokenizer(), None, seed=0, shuffle=False))
    assert prompt.text == prompt.meta["content"] == " ".join([prompt.answer] * 4)
