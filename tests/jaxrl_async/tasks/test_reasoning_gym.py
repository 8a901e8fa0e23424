"""task=reasoning_gym: reasoning-gym's datasets as a task, held-out split, the dataset's own score.

The tests that generate or score data skip without reasoning-gym (`pip install -e ".[envs]"`);
the lazy-import and config tests run without it.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from jaxrl_async.tasks import build_task
from jaxrl_async.tasks.reasoning_gym import INSTALL
from jaxrl_async.tokenizer import tiny_tokenizer
from tests.helpers import REPO
from tests.helpers.train_runs import QUIET

needs_rg = pytest.mark.skipif(
    importlib.util.find_spec("reasoning_gym") is None,
    reason='reasoning-gym is not installed (pip install -e ".[envs]")')
# chain_sum: cheap to generate, scored by exact match of the tagged number.
SMALL = {"name": "reasoning_gym", "dataset": "chain_sum", "size": 40, "num_test_prompts": 10}


def task_of(**keys):
    return build_task({**SMALL, **keys})


def reward(task, example, completion):
    prompt = task.encoder(tiny_tokenizer(), None)(example)
    return asyncio.run(task.reward(prompt, completion, []))


def test_the_task_its_config_and_help_never_import_reasoning_gym():
    """Its import takes over a second: `--help`, the other tasks and a built task must not pay it."""
    code = ("import runpy, sys\nsys.argv = ['train', 'task=reasoning_gym', '--help']\ntry:\n"
            "    runpy.run_module('jaxrl_async.train', run_name='__main__')\nexcept SystemExit:\n    pass\n"
            "from jaxrl_async.tasks import build_task\nbuild_task({'name': 'reasoning_gym'})\n"
            "print('reasoning_gym' in sys.modules, file=sys.stderr)")
    p = subprocess.run([sys.executable, "-c", code], cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
                       capture_output=True, text=True, timeout=60)
    assert p.stderr.strip() == "False", p.stderr
    assert "task.dataset_args" in p.stdout and "task.num_test_prompts" in p.stdout


@pytest.mark.parametrize("keys, message", [
    ({"dataset_args": {"seed": 3}}, r"^task.dataset_args.seed=3: set task.seed instead"),
    ({"dataset_args": {"size": 3}}, r"^task.dataset_args.size=3: set task.size instead"),
    ({"num_test_prompts": 0}, r"^task.num_test_prompts=0: must be an int >= 1"),
    ({"dataset_args": "min_terms=2"}, r"^task.dataset_args='min_terms=2': must be a mapping"),
])
def test_keys_the_task_owns_or_cannot_read_are_one_line_errors_naming_them(keys, message):
    with pytest.raises(ValueError, match=message) as info:
        task_of(**keys)
    assert "\n" not in str(info.value)


def test_the_command_line_sets_the_datasets_arguments_as_one_mapping():
    from jaxrl_async.job.setup import typed_config
    from tests.helpers.train_runs import compose_train

    setup = typed_config(compose_train(["task=reasoning_gym", "task.dataset_args={min_terms: 2, max_terms: 3}"]))
    assert build_task(setup.task).cfg.dataset_config() == {"min_terms": 2, "max_terms": 3, "seed": 0, "size": 1100}
    assert build_task(typed_config(compose_train(["task=reasoning_gym"])).task).cfg.args == {}


def test_without_the_package_the_error_is_the_install_line(monkeypatch):
    monkeypatch.setitem(sys.modules, "reasoning_gym", None)  # import reasoning_gym raises ModuleNotFoundError
    with pytest.raises(ValueError, match="^" + re.escape(INSTALL) + "$"):
        task_of().examples()


@needs_rg
def test_the_splits_are_deterministic_disjoint_by_question_and_keep_the_entry():
    import reasoning_gym

    task = task_of()
    train, test = task.examples(), task.test_examples()
    again = task_of()
    assert [(e.prompt_id, e.content, e.answer) for e in again.examples() + again.test_examples()] == \
        [(e.prompt_id, e.content, e.answer) for e in train + test]
    assert len(train) == 40 and 0 < len(test) <= 10
    questions = {e.meta["entry"]["question"] for e in train}
    assert not questions & {e.meta["entry"]["question"] for e in test}
    assert len({e.prompt_id for e in train + test}) == len(train) + len(test)
    # The entries are reasoning-gym's own records: items 0..39 train, the next ones held out.
    items = reasoning_gym.create_dataset("chain_sum", seed=0, size=50)
    assert [e.meta["entry"] for e in train] == [items[i] for i in range(40)]
    held_out = [i for i in range(40, 50) if items[i]["question"] not in questions]
    assert [e.prompt_id for e in test] == [f"reasoning_gym-chain_sum-{i}" for i in held_out]
    assert [e.meta["entry"] for e in test] == [items[i] for i in held_out]
    assert train[0].content.startswith(items[0]["question"]) and "<answer>" in train[0].content
    assert train[0].answer["entry"] is train[0].meta["entry"]


@needs_rg
def test_a_held_out_question_that_is_also_a_training_one_is_left_out(caplog):
    """A small question space (one-digit sums of two terms) repeats questions across the splits."""
    task = task_of(size=150, num_test_prompts=50,
                   dataset_args={"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1})
    train, test = task.examples(), task.test_examples()
    seen = {e.meta["entry"]["question"] for e in train}
    assert 0 < len(test) < 50 and not seen & {e.meta["entry"]["question"] for e in test}
    assert f"{50 - len(test)} of task.num_test_prompts=50 held-out questions" in caplog.text


@needs_rg
def test_the_datasets_own_score_rewards_the_tagged_answer_in_the_reward_workers():
    task = task_of()
    example = task.test_examples()[0]
    gold = example.meta["entry"]["answer"]
    assert task._pool is not None  # the real reward path: the killable worker processes
    right = reward(task, example, f"Adding up step by step... <answer> {gold} </answer>")
    assert (right.value, right.error) == (1.0, None)
    wrong = reward(task, example, "<answer>not a number</answer>")
    assert (wrong.value, wrong.error) == (0.0, None)
    untagged = reward(task, example, gold)  # reasoning-gym's eval reads the tags only
    assert (untagged.value, untagged.error) == (0.0, None)
    # The last tagged span counts, as reasoning_gym.utils.extract_answer takes it.
    last = reward(task, example, f"<answer>0</answer> no, <answer>{gold}</answer>")
    assert last.value == 1.0


@needs_rg
def test_a_composite_mixes_datasets_and_each_entry_is_scored_by_its_own_dataset():
    specs = [{"name": "chain_sum", "weight": 1.0, "config": {}}, {"name": "count_bits", "weight": 1.0, "config": {}}]
    task = task_of(dataset="composite", dataset_args={"datasets": specs})
    examples = task.examples() + task.test_examples()
    sources = {e.meta["entry"]["metadata"]["source_dataset"] for e in examples}
    assert sources == {"chain_sum", "count_bits"}
    for source in sorted(sources):
        example = next(e for e in examples if e.meta["entry"]["metadata"]["source_dataset"] == source)
        assert reward(task, example, f"<answer>{example.meta['entry']['answer']}</answer>").value == 1.0


@needs_rg
@pytest.mark.parametrize("keys, message", [
    ({"dataset": "chain_sumz"}, r"^task.dataset='chain_sumz': not a reasoning-gym dataset; did you mean chain_sum"),
    ({"dataset": "zzz"}, r"^task.dataset='zzz': not a reasoning-gym dataset; it has \d+, e.g. "),
    ({"dataset_args": {"bogus": 1}}, r"^task.dataset_args=\{'bogus': 1\}: dataset 'chain_sum' refuses them "
                                     r"\(TypeError: .*bogus"),
    ({"dataset": "composite"}, r"^task.dataset_args.datasets=None: dataset=composite needs a list of "),
    ({"dataset": "composite", "dataset_args": {"datasets": [{"name": "nope", "weight": 1, "config": {}}]}},
     r"^task.dataset_args=.*: dataset 'composite' refuses them \(ValueError: Dataset 'nope' not registered\)"),
    ({"dataset_args": {"min_terms": 5, "max_terms": 2}}, r"^task.dataset_args=.*: dataset 'chain_sum' refuses them "
                                                         r"\(AssertionError: max_terms must be >= min_terms\)"),
])
def test_a_dataset_or_arguments_reasoning_gym_refuses_are_one_line_naming_the_key(keys, message):
    with pytest.raises(ValueError, match=message) as info:
        task_of(**keys).examples()
    assert "\n" not in str(info.value)


def train(run_dir: Path, *overrides: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "HYDRA_FULL_ERROR": "0"}
    return subprocess.run([sys.executable, "-m", "jaxrl_async.train", *QUIET, f"hydra.run.dir={run_dir}",
                           "task=reasoning_gym", *overrides], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=600)


@needs_rg
def test_an_unknown_dataset_stops_train_in_one_line_before_any_run_dir(tmp_path):
    proc = train(tmp_path / "run", "task.dataset=nope")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.startswith("error: task.dataset='nope': not a reasoning-gym dataset")
    assert proc.stderr.count("\n") == 1, proc.stderr
    assert not (tmp_path / "run").exists()


@needs_rg
@pytest.mark.slow
def test_a_short_run_trains_on_it_passes_the_audit_and_eval_scores_its_held_out_split(tmp_path, capsys):
    from jaxrl_async.cli.eval import main as eval_main

    run_dir = tmp_path / "run"
    proc = train(run_dir, "task.dataset=count_bits", "task.size=64", "task.num_test_prompts=8", "steps=3",
                 "batch_groups=2", "group_size=4", "max_new_tokens=8", "engine.max_len=512")
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    # Every completion was scored by the dataset's own score_answer in a worker, none failed.
    assert summary["rewards_scored"] >= 3 * 2 * 4 and summary["reward_errors"] == 0
    admitted = [json.loads(line)["prompt"] for line in (run_dir / "ledger.jsonl").read_text().splitlines()
                if json.loads(line)["event"] == "admit"]
    assert admitted and all(p.startswith("reasoning_gym-count_bits-") and int(p.rsplit("-", 1)[1]) < 64
                            for p in admitted)
    audit = subprocess.run([sys.executable, "-m", "planner.audit", str(run_dir), "--max-staleness", "1"],
                           cwd=REPO, capture_output=True, text=True, timeout=120)
    assert audit.returncode == 0 and "PASS" in audit.stdout, audit.stdout + audit.stderr
    code = eval_main(["task=reasoning_gym", "task.dataset=count_bits", "task.size=64", "task.num_test_prompts=8",
                      "max_new_tokens=8", "output=json"])
    out = capsys.readouterr().out
    assert code == 0, out
    result = json.loads(out)
    assert result["split"] == "test" and result["n"] == 8 and result["reward_errors"] == 0
