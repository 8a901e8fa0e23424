"""Tokenizers for the models: one wrapper over a HF `tokenizers.Tokenizer`, three ways to build it.

- `Tokenizer.from_hf_dir`: a HF model directory's `tokenizer.json` (+ `tokenizer_config.json`).
- `Tokenizer.from_gguf`: the vocabulary, merges and chat template in a GGUF file's metadata
  (GPT-2 style byte-level BPE, as SmolLM2 / Llama-3 / Qwen files use).
- `tiny_tokenizer()`: a byte tokenizer built in code (ids 0..255 are the bytes, then a few
  special tokens), for the random `tiny` model; nothing is downloaded.

The chat template is rendered with jinja2 the way transformers does (sandboxed, trim_blocks,
lstrip_blocks), so prompts match what the model was trained on. To add another tokenizer kind,
add a constructor that returns `Tokenizer`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jinja2.sandbox
import tokenizers
from tokenizers import AddedToken, decoders, models, pre_tokenizers

# GGUF `tokenizer.ggml.token_type` values (llama.cpp's llama_token_type).
_CONTROL, _USER_DEFINED = 3, 4

# llama.cpp's pre-tokenizer names -> the split used by the HF tokenizer of that family.
# GPT-2 regex is ByteLevel's own; the others split digits first.
_GPT2_PRE = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
_DIGITS_THEN_GPT2 = pre_tokenizers.Sequence(
    [pre_tokenizers.Digits(individual_digits=True), _GPT2_PRE])
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


def _split_then_bytes(regex: str) -> pre_tokenizers.PreTokenizer:
    return pre_tokenizers.Sequence([
        pre_tokenizers.Split(tokenizers.Regex(regex), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])


_GGUF_PRE_TOKENIZERS = {
    "default": lambda: _GPT2_PRE,
    "gpt-2": lambda: _GPT2_PRE,
    "smollm": lambda: _DIGITS_THEN_GPT2,  # SmolLM's tokenizer.json: Digits, then ByteLevel
    "starcoder": lambda: _DIGITS_THEN_GPT2,
    "llama-bpe": lambda: _split_then_bytes(_LLAMA3_SPLIT),
    "llama3": lambda: _split_then_bytes(_LLAMA3_SPLIT),
    "qwen2": lambda: _split_then_bytes(_QWEN2_SPLIT),
}


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map used by byte-level BPE vocabularies."""
    printable = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
                 + list(range(ord("®"), ord("ÿ") + 1)))
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return chars


@dataclass(frozen=True)
class Tokenizer:
    """Text <-> token ids, the special ids the engine needs, and the chat template."""

    backend: tokenizers.Tokenizer
    bos_token_id: int | None
    eos_token_ids: tuple[int, ...]
    pad_token_id: int | None
    chat_template: str | None = None
    add_bos: bool = False  # whether `encode` prepends BOS by default

    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, *, add_bos: bool | None = None) -> list[int]:
        ids = self.backend.encode(text, add_special_tokens=False).ids
        if (self.add_bos if add_bos is None else add_bos) and self.bos_token_id is not None:
            ids = [self.bos_token_id, *ids]
        return ids

    def decode(self, ids: list[int], *, skip_special_tokens: bool = True) -> str:
        return self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def token_to_id(self, token: str) -> int | None:
        return self.backend.token_to_id(token)

    def id_to_token(self, token_id: int) -> str | None:
        return self.backend.id_to_token(token_id)

    def apply_chat_template(self, messages: list[dict[str, str]], *,
                            add_generation_prompt: bool = True, **kwargs: Any) -> str:
        """Render `messages` ([{"role", "content"}]) to the prompt text the model expects."""
        if self.chat_template is None:
            raise ValueError("tokenizer has no chat_template; pass plain text prompts instead")
        env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)

        def raise_exception(message: str) -> None:
            raise ValueError(f"chat template: {message}")

        env.globals["raise_exception"] = raise_exception
        special = {"bos_token": self._token(self.bos_token_id),
                   "eos_token": self._token(self.eos_token_ids[0] if self.eos_token_ids else None)}
        return env.from_string(self.chat_template).render(
            messages=messages, add_generation_prompt=add_generation_prompt, **special, **kwargs)

    def _token(self, token_id: int | None) -> str:
        return "" if token_id is None else self.backend.id_to_token(token_id)

    def save_hf_dir(self, path: str | Path) -> Path:
        """This tokenizer as a HF tokenizer directory (`from_hf_dir`'s inverse), for a library that
        loads one by path (verifiers' renderer, tasks/verifiers_env.py). Its end-of-turn token (the
        last of `eos_token_ids`) is the directory's `eos_token`."""
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        self.backend.save(str(path / "tokenizer.json"))
        def token(token_id: int | None) -> str | None:
            return None if token_id is None else self.backend.id_to_token(token_id)

        config = {"tokenizer_class": "PreTrainedTokenizerFast", "chat_template": self.chat_template,
                  "add_bos_token": self.add_bos, "bos_token": token(self.bos_token_id),
                  "eos_token": token(self.eos_token_ids[-1] if self.eos_token_ids else None),
                  "pad_token": token(self.pad_token_id)}
        (path / "tokenizer_config.json").write_text(json.dumps(config))
        return path

    # ------------------------------------------------------------------------ constructors

    @classmethod
    def from_hf_dir(cls, path: str | Path) -> Tokenizer:
        """`tokenizer.json` plus the special tokens and template of `tokenizer_config.json`."""
        path = Path(path)
        backend = tokenizers.Tokenizer.from_file(str(path / "tokenizer.json"))
        config_file = path / "tokenizer_config.json"
        config = json.loads(config_file.read_text()) if config_file.exists() else {}

        def token_id(key: str) -> int | None:
            token = config.get(key)
            if isinstance(token, dict):  # AddedToken serialised by transformers
                token = token.get("content")
            return None if token is None else backend.token_to_id(token)

        eos = token_id("eos_token")
        template = config.get("chat_template")
        template_file = path / "chat_template.jinja"
        if template is None and template_file.exists():
            template = template_file.read_text()
        return cls(backend=backend, bos_token_id=token_id("bos_token"),
                   eos_token_ids=() if eos is None else (eos,), pad_token_id=token_id("pad_token"),
                   chat_template=template, add_bos=bool(config.get("add_bos_token", False)))

    @classmethod
    def from_gguf(cls, fields: dict[str, Any]) -> Tokenizer:
        """Byte-level BPE from GGUF metadata (`fields`: key -> decoded value, see loading.py)."""
        kind = fields.get("tokenizer.ggml.model")
        if kind != "gpt2":
            raise ValueError(
                f"GGUF tokenizer.ggml.model={kind!r}: only 'gpt2' (byte-level BPE) is supported")
        pre = fields.get("tokenizer.ggml.pre", "default")
        if pre not in _GGUF_PRE_TOKENIZERS:
            raise ValueError(f"GGUF tokenizer.ggml.pre={pre!r}: supported are "
                             f"{sorted(_GGUF_PRE_TOKENIZERS)}")
        tokens: list[str] = fields["tokenizer.ggml.tokens"]
        merges = [tuple(m.split(" ", 1)) for m in fields.get("tokenizer.ggml.merges", [])]
        vocab = {tok: i for i, tok in enumerate(tokens)}
        backend = tokenizers.Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False))
        backend.pre_tokenizer = _GGUF_PRE_TOKENIZERS[pre]()
        backend.decoder = decoders.ByteLevel()
        types = fields.get("tokenizer.ggml.token_type") or [1] * len(tokens)
        backend.add_special_tokens([AddedToken(t, special=True, normalized=False)
                                    for t, ty in zip(tokens, types) if ty == _CONTROL])
        backend.add_tokens([AddedToken(t, special=False, normalized=False)
                            for t, ty in zip(tokens, types) if ty == _USER_DEFINED])
        eos = fields.get("tokenizer.ggml.eos_token_id")
        eot = fields.get("tokenizer.ggml.eot_token_id")
        eos_ids = tuple(dict.fromkeys(i for i in (eos, eot) if i is not None))
        return cls(backend=backend, bos_token_id=fields.get("tokenizer.ggml.bos_token_id"),
                   eos_token_ids=eos_ids, pad_token_id=fields.get("tokenizer.ggml.padding_token_id"),
                   chat_template=fields.get("tokenizer.chat_template"),
                   # llama.cpp honours `tokenizer.ggml.add_bos_token`, but the HF tokenizers of
                   # byte-level models (SmolLM2, Qwen) and transformers' GGUF import add no BOS;
                   # their chat templates open every turn with a special token instead.
                   add_bos=False)


TINY_SPECIAL_TOKENS = ("<|bos|>", "<|eos|>", "<|pad|>", "<|im_start|>", "<|im_end|>",
                       "<|reserved_0|>", "<|reserved_1|>", "<|reserved_2|>")
TINY_VOCAB_SIZE = 256 + len(TINY_SPECIAL_TOKENS)  # 264: bytes, then the specials
TINY_CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def tiny_tokenizer() -> Tokenizer:
    """Byte tokenizer: id b < 256 is byte b; ids 256.. are TINY_SPECIAL_TOKENS; no merges."""
    chars = bytes_to_unicode()
    vocab = {chars[b]: b for b in range(256)}
    vocab.update({tok: 256 + i for i, tok in enumerate(TINY_SPECIAL_TOKENS)})
    backend = tokenizers.Tokenizer(models.BPE(vocab=vocab, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens(
        [AddedToken(t, special=True, normalized=False) for t in TINY_SPECIAL_TOKENS])
    ids = {tok: 256 + i for i, tok in enumerate(TINY_SPECIAL_TOKENS)}
    return Tokenizer(backend=backend, bos_token_id=ids["<|bos|>"],
                     eos_token_ids=(ids["<|eos|>"], ids["<|im_end|>"]),
                     pad_token_id=ids["<|pad|>"], chat_template=TINY_CHAT_TEMPLATE)
