"""`TrainerConfig`: the typed form of a `conf/trainer/*.yaml` group.

The YAML holds four sections (`loss`, `optim`, `mesh`, and the step's own keys);
`planner.configs.build(TrainerConfig, values, "trainer")` turns the composed dict into these
frozen dataclasses (the sections too) and refuses unknown keys, naming them and the known ones.
Defaults live only in the dataclasses.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from jaxrl_async.models.transformer import REMAT_CHOICES
from jaxrl_async.trainer.losses import LossConfig
from jaxrl_async.trainer.optim import OptimConfig
from planner.configs import check

COMPUTE_DTYPES = ("float32", "bfloat16")


@dataclass(frozen=True)
class MeshConfig:
    """`trainer.mesh`: the trainer's device mesh, data × fsdp × tensor over the job's first
    `size` devices (every process's, in `jax.devices()` order; jaxrl_async/cluster/placement.py).

    Params and optimizer state are sharded by the model's logical-axis table
    (jaxrl_async/sharding.py RULES: weights over fsdp and tensor), batch rows over data × fsdp.
    All ones keep the trainer unsharded on one device.

    Attributes:
      data: devices the batch rows are split over (params replicated)
      fsdp: devices the batch rows and the weights are split over (ZeRO-3 style)
      tensor: devices each layer's heads and MLP are split over (Megatron style)
    """

    data: int = 1
    fsdp: int = 1
    tensor: int = 1

    def __post_init__(self) -> None:
        for name in ("data", "fsdp", "tensor"):
            value = getattr(self, name)
            check(isinstance(value, int) and not isinstance(value, bool) and value >= 1, f"trainer.mesh.{name}", value,
                  "must be an int >= 1")

    @property
    def size(self) -> int:
        return self.data * self.fsdp * self.tensor


@dataclass(frozen=True)
class TrainerConfig:
    """`trainer=`: the loss, the optimizer, the device mesh and the train step's own keys.

    Attributes:
      loss: which GRPO variant trains (`trainer.loss.*`, trainer/losses.py).
      optim: AdamW and its schedule (`trainer.optim.*`, trainer/optim.py).
      num_microbatches: Gradient accumulation: the batch's rows are split into this many
        micro-batches, scanned inside one jitted step; the batch's row count must be a multiple of
        it.
      compute_dtype: Params and optimizer state stay float32; "bfloat16" casts the params for the
        forward and backward pass (gradients flow back to the float32 master weights).
      remat: Rematerialisation of each layer for the backward pass: "none" keeps every activation it
        needs, "full" only each layer's input (recomputing the layer), the other names keep what
        their jax.checkpoint policy saves (jaxrl_async/models/transformer.py REMAT_POLICIES).
      logits_chunk: Tokens per chunk of the LM head in the loss: 0 computes the [tokens, vocab]
        logits of a micro-batch at once; N > 0 computes them for about N tokens at a time (every row
        of the micro-batch, max(1, N // rows) positions each) and recomputes each chunk in the
        backward pass, so the logits' temporaries shrink to a chunk's for one extra head matmul. The
        same gradients up to float roundoff (jaxrl_async/trainer/step.py chunked_token_stats).
      mesh: the trainer's device mesh (`trainer.mesh.*`).
    """

    loss: LossConfig = field(default_factory=LossConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    num_microbatches: int = 1
    compute_dtype: str = "float32"
    remat: str = "none"
    logits_chunk: int = 0
    mesh: MeshConfig = field(default_factory=MeshConfig)

    def __post_init__(self) -> None:
        check(isinstance(self.num_microbatches, int) and self.num_microbatches >= 1, "TrainerConfig.num_microbatches",
              self.num_microbatches, "must be an int >= 1")
        check(self.compute_dtype in COMPUTE_DTYPES, "TrainerConfig.compute_dtype", self.compute_dtype,
              f"must be one of {COMPUTE_DTYPES}")
        check(isinstance(self.logits_chunk, int) and not isinstance(self.logits_chunk, bool) and self.logits_chunk >= 0,
              "trainer.logits_chunk", self.logits_chunk, "must be an int >= 0 (0: whole logits; N: tokens per chunk)")
        check(self.remat in REMAT_CHOICES, "trainer.remat", self.remat, f"must be one of {', '.join(REMAT_CHOICES)}")
