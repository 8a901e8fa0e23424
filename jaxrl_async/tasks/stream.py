"""`PromptStream`: the checkpointable, epoch-aware iterator of prompts that feeds admission.

Built on grain: `MapDataset.source(examples) -> shuffle(seed) -> repeat(num_epochs) ->
map(encode)`. grain's shuffle draws a fresh permutation per epoch (seed + epoch) from the global
index, so the whole position of the stream is one integer, `next_index`: the state dict is that
index plus what identifies the data (seed, shuffle, number of examples), and restoring it replays
exactly the prompts that followed. It is JSON-serialisable so that the checkpoint can hold it next
to the planner state.

Elements are produced on the calling thread (grain `ReadOptions(num_threads=0)`): encoding a
prompt is cheap, and the async runtime should not get background threads it does not own.
Note: grain's index shuffle is slow for tiny datasets (about 5 ms a prompt for 5 examples, 0.04
ms for 1000), irrelevant next to a generation but the reason tests keep their streams short.
grain imports JAX (seconds), so it is imported where a stream is built: a task's config module
imports this one through tasks/base.py, and `--help` reads the task configs without JAX.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from jaxrl_async.tasks.base import Example, Prompt

_STATE_KEYS = ("next_index", "seed", "shuffle", "num_examples")


class PromptStream(Iterator["Prompt"]):
    """Prompts of `examples`, encoded by `encode`, `num_epochs` times (None: forever)."""

    def __init__(self, examples: Sequence[Example], encode: Callable[[Example], Prompt], *,
                 seed: int, shuffle: bool = True, num_epochs: int | None = None):
        if not examples:
            raise ValueError("PromptStream: the task produced no examples")
        if not isinstance(seed, int) or not 0 <= seed < 2**32:
            raise ValueError(f"PromptStream.seed={seed!r}: must be an int in [0, 2**32)")
        if num_epochs is not None and (not isinstance(num_epochs, int) or num_epochs < 1):
            raise ValueError(f"PromptStream.num_epochs={num_epochs!r}: must be None (forever) or an int >= 1")
        self.seed, self.shuffle, self.num_epochs = seed, shuffle, num_epochs
        self.num_examples = len(examples)
        import grain

        dataset = grain.MapDataset.source(list(examples))
        if shuffle:
            dataset = dataset.shuffle(seed)
        dataset = dataset.repeat(num_epochs).map(encode)
        read = grain.ReadOptions(num_threads=0, prefetch_buffer_size=0)
        self._iterator = dataset.to_iter_dataset(read).__iter__()

    def __iter__(self) -> PromptStream:
        return self

    def __next__(self) -> Prompt:
        return next(self._iterator)

    @property
    def position(self) -> int:
        """Prompts handed out so far, over all epochs."""
        return int(self._iterator.get_state()["next_index"])

    @property
    def epoch(self) -> int:
        """The epoch (0-based) that the next prompt belongs to."""
        return self.position // self.num_examples

    def state_dict(self) -> dict[str, Any]:
        return {"next_index": self.position, "seed": self.seed, "shuffle": self.shuffle,
                "num_examples": self.num_examples}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from `state`; refuses a state taken on other data or another shuffle."""
        missing = [k for k in _STATE_KEYS if k not in state]
        if missing:
            raise ValueError(f"PromptStream state: missing keys {missing} (has {sorted(state)})")
        mine = self.state_dict()
        for key in ("seed", "shuffle", "num_examples"):
            if state[key] != mine[key]:
                raise ValueError(f"PromptStream state: {key}={state[key]!r} but this stream has "
                                 f"{key}={mine[key]!r}; resume with the same task data and seed")
        index = state["next_index"]
        limit = None if self.num_epochs is None else self.num_epochs * self.num_examples
        if not isinstance(index, int) or index < 0 or (limit is not None and index > limit):
            raise ValueError(f"PromptStream state: next_index={index!r} must be an int in [0, {limit}]")
        self._iterator.set_state({"next_index": index})
