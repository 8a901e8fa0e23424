"""Environments: multi-turn, tool-using episodes under the strict bound (docs/environments.md).

A group is n episodes of one prompt. An episode alternates model turns and environment steps
over one token sequence (token-in, token-out): every turn continues the episode's own tokens, the
environment's reply is appended as tokens, and earlier text is never tokenized again. Only the
model's tokens are trained (a loss mask); each carries the version that sampled it.

- `episode.py`: the vocabulary — a turn's result, an episode's outcome, its faults, and the
  `TurnClient` an episode calls to sample a turn.
- `chat.py`: the chat template rendered incrementally: the tokens that close the model's turn and
  open the next one around the environment's messages.
- `task.py`: `EpisodeTask`, the task contract of a multi-turn task (`run_episode`), and
  `ChatEnvTask`, the loop of an environment written as `reset` / `step` / `score_episode`.
- `engine.py`: `EpisodeEngine`, which runs each sample of a request as an episode over a real
  engine and streams its tokens (model and environment) as one sample's pieces.
"""
