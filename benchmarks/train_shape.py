"""The small random model and batch shape that bench_train_step.py and bench_model.py share, so
their figures stay comparable: the command-line flags and the ModelConfig they describe."""

from __future__ import annotations

import argparse

from jaxrl_async.models.config import ModelConfig


def add_train_shape_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--kv-heads", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--rows", type=int, default=16)
    ap.add_argument("--seq", type=int, default=256)


def train_shape_config(args: argparse.Namespace) -> ModelConfig:
    """A Llama-style model of the flags' shape (MLP 4x hidden, no special tokens)."""
    return ModelConfig.tiny(
        vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=4 * args.hidden,
        num_layers=args.layers, num_heads=args.heads, num_kv_heads=args.kv_heads,
        head_dim=args.hidden // args.heads, bos_token_id=None, eos_token_ids=())
