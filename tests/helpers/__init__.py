"""What several test modules share: drivers, fakes and run helpers (never tests themselves).

- `conf_files.py`: reading conf/ files as written and as Hydra composes them.
- `docstrings.py`: the fields a config dataclass's `Attributes:` section documents.
- `train_runs.py`: composing conf/train.yaml and running a training job in-process.
- `engines.py`: reading and comparing a generation engine's output stream.
- `fake_vllm.py`: hand-written stand-ins for vLLM's `AsyncLLM` and its worker.
- `episodes.py`: scripted model turns, and one episode played on the runtime's EpisodeEngine.
- `tasks.py`: scoring a completion with a task's reward.
- `reward_fns.py`: user reward functions that hang, raise or die on some prompts (light to import).
- `scripted.py`, `adversarial.py`: policy drivers (scripted events; random possible interleavings).
- `sim_policies.py`: tiny policies for the simulator tests.
- `tail_policies.py`: a wrapper policy that asks for migrations (the runtime's tail hooks).
- `training_run.py`: a small training run's files written by hand (trace, metrics, summary), timed by
  the simulator's cost model, for calibrate's replay and the plots.
"""

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]  # the repository root
CONF = REPO / "conf"
