"""Tokenizers: the built-in byte tokenizer and chat-template rendering."""

import pytest

from jaxrl_async.models import ModelConfig
from jaxrl_async.tokenizer import TINY_VOCAB_SIZE, tiny_tokenizer


def test_tiny_tokenizer_maps_bytes_to_ids_and_back():
    tok = tiny_tokenizer()
    text = "2+2=4, ünï 🤖"
    ids = tok.encode(text)
    assert ids == list(text.encode("utf-8"))
    assert tok.decode(ids) == text
    assert tok.vocab_size == TINY_VOCAB_SIZE == ModelConfig.tiny().vocab_size


def test_tiny_special_tokens_stay_whole_and_match_the_tiny_config():
    tok, cfg = tiny_tokenizer(), ModelConfig.tiny()
    ids = tok.encode("a<|im_end|>")
    assert ids == [97, tok.token_to_id("<|im_end|>")]
    assert tok.decode(ids) == "a" and tok.decode(ids, skip_special_tokens=False) == "a<|im_end|>"
    assert tok.bos_token_id == cfg.bos_token_id and tok.eos_token_ids == cfg.eos_token_ids
    assert tok.encode("x", add_bos=True) == [cfg.bos_token_id, 120]


def test_chat_template_renders_chatml():
    tok = tiny_tokenizer()
    prompt = tok.apply_chat_template([{"role": "user", "content": "hi"}])
    assert prompt == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    no_template = tok.__class__(tok.backend, None, (), None, chat_template=None)
    with pytest.raises(ValueError, match="no chat_template"):
        no_template.apply_chat_template([{"role": "user", "content": "hi"}])


def test_a_tokenizer_saved_as_a_hf_directory_loads_back_the_same(tmp_path):
    from jaxrl_async.tokenizer import Tokenizer

    tok = tiny_tokenizer()
    back = Tokenizer.from_hf_dir(tok.save_hf_dir(tmp_path / "hf"))
    text = tok.apply_chat_template([{"role": "user", "content": "héllo"}], add_generation_prompt=True)
    assert back.encode(text, add_bos=False) == tok.encode(text, add_bos=False)
    assert back.apply_chat_template([{"role": "user", "content": "héllo"}], add_generation_prompt=True) == text
    # the end-of-turn token (the last stop id) is the directory's eos_token; bos and pad as they were
    assert (back.eos_token_ids, back.bos_token_id, back.pad_token_id) == (tok.eos_token_ids[-1:], tok.bos_token_id,
                                                                          tok.pad_token_id)
