"""A GGUF file with the tiny model's metadata and no tensors, less the keys a test leaves out:
enough for the checks that run before any tensor is read (jaxrl_async/models/gguf_file.py)."""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path

import gguf

from jaxrl_async.tokenizer import tiny_tokenizer


def write_metadata_gguf(path: Path, *, without: Collection[str] = ()) -> Path:
    """A llama GGUF at `path` whose metadata lacks the keys in `without` (full names,
    `llama.block_count`, `tokenizer.ggml.tokens`)."""
    tok = tiny_tokenizer()
    values = {
        "llama.block_count": ("add_block_count", 1), "llama.context_length": ("add_context_length", 64),
        "llama.embedding_length": ("add_embedding_length", 32),
        "llama.feed_forward_length": ("add_feed_forward_length", 64),
        "llama.attention.head_count": ("add_head_count", 2),
        "llama.attention.head_count_kv": ("add_head_count_kv", 2),
        "llama.vocab_size": ("add_vocab_size", tok.vocab_size),
        "tokenizer.ggml.model": ("add_tokenizer_model", "gpt2"),
        "tokenizer.ggml.tokens": ("add_token_list", [tok.id_to_token(i) for i in range(tok.vocab_size)]),
        "tokenizer.ggml.merges": ("add_token_merges", []),
    }
    unknown = set(without) - set(values)
    assert not unknown, f"write_metadata_gguf cannot leave out {sorted(unknown)}"
    w = gguf.GGUFWriter(str(path), "llama")
    for key, (add, value) in values.items():
        if key not in without:
            getattr(w, add)(value)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
