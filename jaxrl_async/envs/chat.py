"""The chat template, rendered incrementally around an episode's turns.

A model turn ends where the model stopped (its stop token, or the length limit). The environment's
reply must then be appended as tokens without tokenizing anything written before: the bridge is the
text the template writes after the assistant's content (e.g. ChatML's "<|im_end|>\\n"), less what the
model already sampled of it (its stop token), followed by the environment's messages and the next
generation prompt — exactly what rendering the whole conversation would add, found by rendering
the conversation with a sentinel for the last assistant content and cutting at it.
"""

from __future__ import annotations

from typing import Any

from jaxrl_async.envs.episode import EpisodeFault
from jaxrl_async.tokenizer import Tokenizer

_SENTINEL = "\x00JAXRL_ASYNC_TURN_END\x00"


def assistant_text(tokenizer: Tokenizer, token_ids: list[int], stop_token_ids: tuple[int, ...]) -> str:
    """A turn's content as the conversation records it: its tokens decoded, the stop token left out."""
    ids = token_ids[:-1] if token_ids and token_ids[-1] in stop_token_ids else token_ids
    return tokenizer.decode(list(ids))


def bridge_text(tokenizer: Tokenizer, messages: list[dict[str, Any]], new_messages: list[dict[str, Any]],
                stopped_on: str | None) -> str:
    """The text between the model's last sampled token and the next turn's first one.

    `messages` end with the assistant turn just sampled; `new_messages` are the environment's reply;
    `stopped_on`: the decoded stop token the turn ended with (None: it hit its length limit, and the
    template's end of turn is written in full)."""
    if not messages or messages[-1].get("role") != "assistant":
        raise ValueError("bridge_text: messages must end with the assistant turn just sampled")
    marked = [*messages[:-1], {**messages[-1], "content": _SENTINEL}]
    before = tokenizer.apply_chat_template(marked, add_generation_prompt=False)
    after = tokenizer.apply_chat_template([*marked, *new_messages], add_generation_prompt=True)
    if before.count(_SENTINEL) != 1 or not after.startswith(before):
        raise EpisodeFault("env_bad_reply", "the chat template does not render the conversation incrementally "
                                            "(a new message changes earlier text)")
    end_of_turn = before.split(_SENTINEL, 1)[1]
    if stopped_on and end_of_turn.startswith(stopped_on):
        end_of_turn = end_of_turn[len(stopped_on):]
    return end_of_turn + after[len(before):]


def bridge_tokens(tokenizer: Tokenizer, messages: list[dict[str, Any]], new_messages: list[dict[str, Any]],
                  turn_ids: list[int], stop_token_ids: tuple[int, ...]) -> list[int]:
    """`bridge_text` tokenized on its own (no BOS): the environment's tokens of the next turn's prompt."""
    stopped_on = None
    if turn_ids and turn_ids[-1] in stop_token_ids:
        stopped_on = tokenizer.decode([turn_ids[-1]], skip_special_tokens=False)
    return tokenizer.encode(bridge_text(tokenizer, messages, new_messages, stopped_on), add_bos=False)
