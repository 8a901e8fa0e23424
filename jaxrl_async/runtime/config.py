"""`RunConfig`: the typed, validated top level of `conf/train.yaml` (docs/design.md §8 command line).

Hydra composes the YAML; `planner.configs.build(RunConfig, top_level, "")` turns the top-level
keys (everything that is not a config group) into one frozen dataclass, once, at the entry point
(job/setup.py `typed_config`). Unknown keys are an error naming the key.

The defaults live here, once: the entry points store them as Hydra's `base/train` node
(jaxrl_async/cli/config_nodes.py), which `conf/train.yaml` lists first, so every field is a
command-line key; the YAML states only what the embedded demo run sets differently (`steps`,
`max_new_tokens`) and documents every key.

How to add a knob: add a field with a default and a comment here, check it in `__post_init__`,
document it in `conf/train.yaml`, read it where it is used.

The `cluster=` group is typed apart, in jaxrl_async/cluster/config.py: the runtime does not
depend on where its processes run.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from planner.configs import check

PROGRESS_MODES = ("auto", "rich", "plain", "off")


@dataclass(frozen=True)
class RolloutConfig:
    """`rollout.*`: liveness of generation (docs/design.md §5 Liveness).

    A group whose current attempt streams no token for `stall_timeout_s` is aborted and
    regenerated through the planner's fault path; a group still queued in the engine counts as
    stalled only when the engine streamed nothing at all for that long. `max_quiet_stalls`
    stall rounds in a row with no token from the engine in between mean the engine itself hangs:
    the run ends with a one-line error instead of wedging.

    Attributes:
      stall_timeout_s: seconds without a token before a group is regenerated; null = off
      max_quiet_stalls: consecutive stall rounds with no token anywhere before the run gives up
    """

    stall_timeout_s: float | None = 300.0
    max_quiet_stalls: int = 3

    def __post_init__(self) -> None:
        t = self.stall_timeout_s
        check(t is None or (isinstance(t, (int, float)) and not isinstance(t, bool) and math.isfinite(t) and t > 0),
              "rollout.stall_timeout_s", t, "must be a number > 0 (seconds), or null to turn stall detection off")
        check(isinstance(self.max_quiet_stalls, int) and not isinstance(self.max_quiet_stalls, bool)
              and self.max_quiet_stalls >= 1, "rollout.max_quiet_stalls", self.max_quiet_stalls, "must be an int >= 1")


@dataclass(frozen=True)
class EvalSchedule:
    """`eval.*`: held-out evaluation during training, on the run's own engine (runtime/evaluation.py).

    Before the first step (the base model, so that every curve starts from it) and after every
    `every`-th step, once the engine holds that step's weights, the task's held-out
    prompts are decoded greedily at the lowest engine priority — behind every rollout, so the
    planner's admissions and deadlines are untouched and the ledger never sees them — and scored
    as `python -m jaxrl_async.eval` scores them. The result goes into the next step's
    metrics.jsonl record and TensorBoard (`eval/pass_at_1`, `eval/mean_reward`, ...) and the last
    one into summary.json.

    Attributes:
      every: evaluate before the first step and after every this many steps; 0 = off
      prompts: the held-out split's first N prompts; null = all of them
      pass_threshold: a completion passes when its reward is >= this
    """

    every: int = 0
    prompts: int | None = None
    pass_threshold: float = 1.0

    def __post_init__(self) -> None:
        check(isinstance(self.every, int) and not isinstance(self.every, bool) and self.every >= 0, "eval.every",
              self.every, "must be an int >= 0 (0 = off)")
        check(self.prompts is None or (isinstance(self.prompts, int) and self.prompts >= 1), "eval.prompts",
              self.prompts, "must be an int >= 1, or null for the whole held-out split")


@dataclass(frozen=True)
class RunConfig:
    """The run: sizes, sampling, bookkeeping. Field names are the command-line keys.

    Attributes:
      max_staleness: η: every trained token has staleness <= η (null = unbounded)
      batch_groups: B: groups per optimizer step
      group_size: n: samples per prompt (GRPO group)
      steps: S: optimizer steps of the whole run (a resumed run counts the earlier ones); the same
        as trainer.optim.total_steps' default, so the learning-rate schedule spans the run.
      seed: model init, data order, sampling seeds
      max_new_tokens: longest completion
      temperature: sampling temperature (the trainer's log-probs are at temperature 1)
      top_p: nucleus sampling (1.0: off)
      admission_window: Candidates the policy sees at once (a lookahead policy may reorder them);
        null = 2·B.
      checkpoint_every: Save after step 1 and then every this many steps, plus on SIGTERM / SIGINT
        and at the end (0: only those two). After step 1, so that a crash at any later point has a
        resume point; then every 50 steps, so that a crash loses at most 50 steps while the
        asynchronous saves stay a small fraction of the run (docs/fault_tolerance.md).
      keep_checkpoints: orbax keeps the newest N
      resume: true: continue hydra.run.dir's run | PATH: continue that run dir; a run that never
        saved a checkpoint starts afresh (its old files in RUN_DIR/attempts/N/)
      export_hf: write the final policy as HF safetensors into run_dir/hf/
      progress: auto (rich on a TTY, plain lines otherwise) | rich | plain | off
      tensorboard: TensorBoard event files in run_dir/tb/
      record_events: write every policy call to policy_events.jsonl (parity replay)
      samples_per_step: samples.jsonl keeps this many trained samples of every step (the first
        sample of each of the batch's first groups): messages, tokens, loss mask, versions,
        per-turn timing, reward and its terms; 0 = none
      rollout: liveness: stall detection
      eval: held-out evaluation during training
    """

    max_staleness: int | None = 1
    batch_groups: int = 8
    group_size: int = 8
    steps: int = 1000
    seed: int = 0
    max_new_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    admission_window: int | None = None
    checkpoint_every: int = 50
    keep_checkpoints: int = 2
    resume: bool | str | None = None
    export_hf: bool = True
    progress: str = "auto"
    tensorboard: bool = True
    record_events: bool = False
    samples_per_step: int = 2
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    eval: EvalSchedule = field(default_factory=EvalSchedule)

    def __post_init__(self) -> None:
        check(self.max_staleness is None or (isinstance(self.max_staleness, int) and self.max_staleness >= 0),
              "max_staleness", self.max_staleness, "must be an int >= 0 or null (unbounded)")
        for name in ("batch_groups", "group_size", "steps", "max_new_tokens", "keep_checkpoints"):
            value = getattr(self, name)
            check(isinstance(value, int) and value >= 1, name, value, "must be an int >= 1")
        for name in ("seed", "checkpoint_every", "samples_per_step"):
            value = getattr(self, name)
            check(isinstance(value, int) and value >= 0, name, value, "must be an int >= 0")
        window = self.admission_window
        check(window is None or (isinstance(window, int) and window >= 1), "admission_window", window,
              "must be an int >= 1, or null for the default 2·batch_groups (0 is not the default: use null)")
        check(self.temperature > 0, "temperature", self.temperature,
              "must be > 0 (RL needs sampling; the behaviour log-probs are at temperature 1)")
        check(0 < self.top_p <= 1, "top_p", self.top_p, "must be in (0, 1]")
        check(self.progress in PROGRESS_MODES, "progress", self.progress, f"must be one of {PROGRESS_MODES}")
        check(self.resume is None or isinstance(self.resume, (bool, str)), "resume", self.resume,
              "must be true, false/null or a run directory")

    @property
    def window(self) -> int:
        """Candidates shown to `policy.admit` at once."""
        return 2 * self.batch_groups if self.admission_window is None else self.admission_window
