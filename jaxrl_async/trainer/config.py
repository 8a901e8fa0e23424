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
    """

    data: int = 1  # devices the batch rows are split over (params replicated)
    fsdp: int = 1  # devices the batch rows and the weights are split over (ZeRO-3 style)
    tensor: int = 1  # devices each layer's heads and MLP are split over (Megatron style)

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
    loss: LossConfig = field(default_factory=LossConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    # Gradient accumulation: the batch's rows are split into this many micro-batches, scanned
    # inside one jitted step; the batch's row count must be a multiple of it.
    num_microbatches: int = 1
    # Params and optimizer state stay float32; "bfloat16" casts the params for the forward and
    # backward pass (gradients flow back to the float32 master weights).
    compute_dtype: str = "float32"
    # Rematerialisation of each layer for the backward pass: "none" keeps every activation it
    # needs, "full" only each layer's input (recomputing the layer), the other names keep what
    # their jax.checkpoint policy saves (jaxrl_async/models/transformer.py REMAT_POLICIES).
    remat: str = "none"
    mesh: MeshConfig = field(default_factory=MeshConfig)

    def __post_init__(self) -> None:
        check(isinstance(self.num_microbatches, int) and self.num_microbatches >= 1, "TrainerConfig.num_microbatches",
              self.num_microbatches, "must be an int >= 1")
        check(self.compute_dtype in COMPUTE_DTYPES, "TrainerConfig.compute_dtype", self.compute_dtype,
              f"must be one of {COMPUTE_DTYPES}")
        check(self.remat in REMAT_CHOICES, "trainer.remat", self.remat, f"must be one of {', '.join(REMAT_CHOICES)}")
