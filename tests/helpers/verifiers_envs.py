"""For the `task=verifiers` tests: the example environments on the import path, and the tiny
tokenizer (tokenizer.py `tiny_tokenizer`) written as the HF directory verifiers' renderer loads."""

from __future__ import annotations

import json
from pathlib import Path

from jaxrl_async.tokenizer import Tokenizer
from tests.helpers import REPO

EXAMPLE_ENVS = REPO / "examples" / "verifiers_envs"


def write_hf_tokenizer(tokenizer: Tokenizer, path: Path) -> Path:
    """`tokenizer` as a HF tokenizer directory (tokenizer.json, tokenizer_config.json with its chat template)."""
    path.mkdir(parents=True, exist_ok=True)
    tokenizer.backend.save(str(path / "tokenizer.json"))
    eos = tokenizer.id_to_token(tokenizer.eos_token_ids[-1])
    pad = None if tokenizer.pad_token_id is None else tokenizer.id_to_token(tokenizer.pad_token_id)
    (path / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "chat_template": tokenizer.chat_template,
        "eos_token": eos, "pad_token": pad, "bos_token": None}))
    return path
