"""`TrainerConfig`: the typed form of a `conf/trainer/*.yaml` group.

The YAML holds four sections (`loss`, `optim`, `mesh`, and the step's own keys);
`planner.configs.build(TrainerConfig, values, "trainer")` turns the composed dict into these
frozen dataclasses (the sections too) and refuses unknown keys, naming them and the known ones.
Defaults live only in the dataclasses. The module imports no JAX, so that `--help` reads the
dataclasses at once: a check against a registry of JAX functions (the loss pieces, the remat
policies) imports it where the check runs.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from jaxrl_async.models.config import PROJECTIONS
from planner.configs import check

COMPUTE_DTYPES = ("float32", "bfloat16")


@dataclass(frozen=True)
class LossConfig:
    """`trainer.loss`: which GRPO variant to train with (trainer/losses.py has the pieces). Names
    are checked against trainer/losses.py's registries themselves, imported where they are checked:
    they hold JAX functions, and this module imports nothing heavy (`--help` reads it).

    Attributes:
      advantage: key of ADVANTAGES
      aggregation: key of AGGREGATIONS
      off_policy: key of OFF_POLICY
      eps_low: ratio clipped below at 1 - eps_low
      eps_high: ratio clipped above at 1 + eps_high (DAPO uses 0.28)
      kl_coef: weight of the k3 KL to TrainBatch.ref_logprobs; 0 = no KL term
      tis_cap: C in min(pi_prox / mu, C) for off_policy="tis"
      decoupled_is_cap: mask tokens with pi_prox / mu above it ("decoupled")
      cispo_eps_low: off_policy="cispo": floor 1 - it on the weight (None: no floor)
      cispo_eps_high: off_policy="cispo": cap 1 + it on the weight
      m2_threshold: off_policy="m2po": tau, the bound on the kept tokens' mean (log pi_prox/mu)^2
      norm_len: constant normalizer of aggregation="drgrpo" (the max new tokens)
      adv_eps: added to the group std in advantage="grpo"
    """

    advantage: str = "grpo"
    aggregation: str = "seq_mean"
    off_policy: str = "tis"
    eps_low: float = 0.2
    eps_high: float = 0.2
    kl_coef: float = 0.0
    tis_cap: float = 2.0
    decoupled_is_cap: float | None = None
    cispo_eps_low: float | None = None
    cispo_eps_high: float = 1.0
    m2_threshold: float = 0.04
    norm_len: int | None = None
    adv_eps: float = 1e-6

    def __post_init__(self) -> None:
        from jaxrl_async.trainer.losses import ADVANTAGES, AGGREGATIONS, OFF_POLICY

        for field, registry in (("advantage", ADVANTAGES), ("aggregation", AGGREGATIONS),
                                ("off_policy", OFF_POLICY)):
            value = getattr(self, field)
            check(value in registry, f"LossConfig.{field}", value, f"must be one of {sorted(registry)}")
        for field in ("eps_low", "eps_high", "kl_coef", "adv_eps"):
            check(getattr(self, field) >= 0, f"LossConfig.{field}", getattr(self, field), "must be >= 0")
        check(self.eps_low < 1, "LossConfig.eps_low", self.eps_low, "must be < 1 (lower clip 1 - eps_low > 0)")
        check(self.tis_cap > 0, "LossConfig.tis_cap", self.tis_cap, "must be > 0")
        check(self.cispo_eps_low is None or 0 <= self.cispo_eps_low <= 1, "LossConfig.cispo_eps_low",
              self.cispo_eps_low, "must be in [0, 1] (the floor 1 - eps_low is >= 0) or None")
        check(self.cispo_eps_high > 0, "LossConfig.cispo_eps_high", self.cispo_eps_high, "must be > 0")
        check(self.m2_threshold > 0, "LossConfig.m2_threshold", self.m2_threshold, "must be > 0")
        check(self.decoupled_is_cap is None or self.decoupled_is_cap > 0, "LossConfig.decoupled_is_cap",
              self.decoupled_is_cap, "must be > 0 or None")
        check(self.aggregation != "drgrpo" or (self.norm_len is not None and self.norm_len > 0), "LossConfig.norm_len",
              self.norm_len, "aggregation='drgrpo' needs a positive constant normalizer (set it to the generation's "
              "max new tokens)")


@dataclass(frozen=True)
class OptimConfig:
    """`trainer.optim`: AdamW with linear warm-up, cosine decay and gradient clipping.

    Attributes:
      lr: peak learning rate, reached after `warmup_steps`
      warmup_steps: linear ramp from 0 to `lr`
      total_steps: warm-up + cosine decay length; constant `lr * min_lr_ratio` after
      min_lr_ratio: final learning rate as a fraction of `lr`
      b1: Adam's first-moment decay
      b2: Adam's second-moment decay
      eps: Adam's denominator floor
      weight_decay: AdamW decay of the weight matrices
      max_grad_norm: clip the global gradient norm to it; None = no clipping
    """

    lr: float = 1e-6
    warmup_steps: int = 0
    total_steps: int = 1000
    min_lr_ratio: float = 0.1
    b1: float = 0.9
    b2: float = 0.999
    eps: float = 1e-8
    weight_decay: float = 0.01
    max_grad_norm: float | None = 1.0

    def __post_init__(self) -> None:
        check(self.lr > 0, "OptimConfig.lr", self.lr, "must be > 0")
        check(self.warmup_steps >= 0, "OptimConfig.warmup_steps", self.warmup_steps, "must be >= 0")
        check(self.total_steps > 0, "OptimConfig.total_steps", self.total_steps, "must be > 0")
        if self.warmup_steps > self.total_steps:
            raise ValueError(
                f"OptimConfig.warmup_steps={self.warmup_steps} > total_steps={self.total_steps}: "
                "the warm-up is part of the schedule")
        check(0 <= self.min_lr_ratio <= 1, "OptimConfig.min_lr_ratio", self.min_lr_ratio, "must be in [0, 1]")
        for name in ("b1", "b2"):
            check(0 <= getattr(self, name) < 1, f"OptimConfig.{name}", getattr(self, name), "must be in [0, 1)")
        check(self.weight_decay >= 0, "OptimConfig.weight_decay", self.weight_decay, "must be >= 0")
        check(self.max_grad_norm is None or self.max_grad_norm > 0, "OptimConfig.max_grad_norm", self.max_grad_norm,
              "must be > 0 or None")


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
class LoraConfig:
    """`trainer.lora`: low-rank adapters (Hu et al. 2021) instead of full fine-tuning.

    With rank r > 0 every targeted projection W of every layer trains W + (alpha / r) A B with A
    [in, r] and B [r, out] (B starts at 0, so step 0 is the base model); the base weights are
    frozen and only A and B have gradients and optimizer state (models/lora.py). The engine gets
    only the adapter at a push and merges it into its copy of the base; the run's hf/ gains a PEFT
    adapter beside the base weights. Dropout on the adapter's input is not built: the adapter is
    merged into W for the forward (models/lora.py says why), where no input of its own exists.
    The embedding, the LM head and the norms stay frozen: on the random `tiny` model, whose head
    is drawn small and whose final RMSNorm bounds the hidden state, adapters cannot make the
    near-uniform outputs confident, so the embedded repeat_letter demo does not learn with LoRA
    (train a pretrained model's adapters instead: +experiment=smollm2_arithmetic_lora).

    Attributes:
      rank: r, the adapters' inner dimension; 0 = full fine-tuning (no adapter)
      alpha: the adapter's scale is alpha / rank (PEFT's `lora_alpha`)
      targets: the projections that get an adapter, by their HF module names (a subset of
        q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj)
      export_merged: also write the merged weights (W + scale A B) as a HF model into hf/merged/
    """

    rank: int = 0
    alpha: float = 16.0
    targets: tuple[str, ...] = PROJECTIONS
    export_merged: bool = False

    def __post_init__(self) -> None:
        check(isinstance(self.rank, int) and not isinstance(self.rank, bool) and self.rank >= 0, "trainer.lora.rank",
              self.rank, "must be an int >= 0 (0: full fine-tuning)")
        check(self.alpha > 0, "trainer.lora.alpha", self.alpha, "must be > 0")
        object.__setattr__(self, "targets", tuple(self.targets))
        unknown = [t for t in self.targets if t not in PROJECTIONS]
        check(not unknown and len(self.targets) > 0, "trainer.lora.targets", list(self.targets),
              f"must name one or more of the layers' projections {list(PROJECTIONS)}"
              + (f" ({unknown[0]!r} matches no module)" if unknown else ""))
        check(len(set(self.targets)) == len(self.targets), "trainer.lora.targets", list(self.targets),
              "names a projection twice")

    @property
    def enabled(self) -> bool:
        return self.rank > 0

    @property
    def scale(self) -> float:
        """alpha / rank: the factor of A B (only meaningful when `enabled`)."""
        return self.alpha / self.rank if self.rank else 0.0


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
      lora: low-rank adapters instead of full fine-tuning (`trainer.lora.*`; rank 0: off).
    """

    loss: LossConfig = field(default_factory=LossConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    num_microbatches: int = 1
    compute_dtype: str = "float32"
    remat: str = "none"
    logits_chunk: int = 0
    mesh: MeshConfig = field(default_factory=MeshConfig)
    lora: LoraConfig = field(default_factory=LoraConfig)

    def __post_init__(self) -> None:
        check(isinstance(self.num_microbatches, int) and self.num_microbatches >= 1, "TrainerConfig.num_microbatches",
              self.num_microbatches, "must be an int >= 1")
        check(self.compute_dtype in COMPUTE_DTYPES, "TrainerConfig.compute_dtype", self.compute_dtype,
              f"must be one of {COMPUTE_DTYPES}")
        check(isinstance(self.logits_chunk, int) and not isinstance(self.logits_chunk, bool) and self.logits_chunk >= 0,
              "trainer.logits_chunk", self.logits_chunk, "must be an int >= 0 (0: whole logits; N: tokens per chunk)")
        from jaxrl_async.models.transformer import REMAT_CHOICES

        check(self.remat in REMAT_CHOICES, "trainer.remat", self.remat, f"must be one of {', '.join(REMAT_CHOICES)}")
