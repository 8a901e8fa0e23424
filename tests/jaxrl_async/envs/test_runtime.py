"""Episodes through the real controller, policy, ledger and audit (the engine and trainer are the
controller harness's doubles, tests/helpers/controller_harness.py, behind a real EpisodeEngine)."""

from __future__ import annotations

import json

import numpy as np

from jaxrl_async.envs.engine import EpisodeEngine
from jaxrl_async.envs.task import EpisodeContext
from jaxrl_async.runtime.config import RunConfig
from jaxrl_async.runtime.controller import Controller
from jaxrl_async.runtime.metrics import METRICS_FILE, JsonlSink
from jaxrl_async.runtime.samples import SAMPLES_FILE, SampleLog
from jaxrl_async.tokenizer import tiny_tokenizer
from planner.ledger import LEDGER_FILE, LedgerWriter, read_ledger
from planner.ledger_audit import audit
from planner.registry import make_policy
from planner.run_trace import TRACE_FILE, TraceWriter, read_run_trace
from planner.types import PlanContext
from tests.helpers.echo_env import echo_task
from tests.helpers.controller_harness import InstantTrainer, ScriptedEngine, run


def episode_controller(run_dir, *, fault: str = "", steps: int = 4, max_rate: float = 1.0):
    cfg = RunConfig(max_staleness=1, batch_groups=2, group_size=2, steps=steps, max_new_tokens=4, seed=0,
                    export_hf=False, progress="off", tensorboard=False, samples_per_step=3)
    tokenizer = tiny_tokenizer()
    task = echo_task(max_turns=3, fault=fault, fault_at_turn=1, max_reward_failure_rate=max_rate)
    inner = ScriptedEngine(tokens=2)
    engine = EpisodeEngine(inner, task, EpisodeContext(tokenizer, (257,)), max_len=512)
    run_dir.mkdir(parents=True, exist_ok=True)
    trainer = InstantTrainer()
    controller = Controller(
        cfg, policy=make_policy("lookahead", PlanContext(2, 2, 1, steps)), engine=engine, trainer=trainer,
        task=task, tokenizer=tokenizer, stream=task.make_stream(tokenizer, tokenizer.chat_template, seed=0),
        run_dir=run_dir, ledger=LedgerWriter(run_dir / LEDGER_FILE, buffer_lines=16),
        sinks=[JsonlSink(run_dir / METRICS_FILE, append=False)], stop_token_ids=(257,),
        samples=SampleLog(run_dir, cfg.samples_per_step, tokenizer, append=False),
        trace=TraceWriter(run_dir / TRACE_FILE), trace_meta={"group_size": 2, "workers": 1, "slots": 64})
    return controller, trainer


def test_a_run_of_episodes_trains_only_model_tokens_and_its_ledger_holds_every_turn(tmp_path):
    controller, trainer = episode_controller(tmp_path)
    result = run(controller)
    assert result.completed
    trains = [e for e in read_ledger(tmp_path / LEDGER_FILE) if e["event"] == "train"]
    turns = [t for e in trains for g in e["groups"] for t in g["turns"]]
    assert len(turns) == 4 * 2 * 2 * 3  # steps x groups x episodes x model turns
    for e in trains:
        for g in e["groups"]:
            total = {}
            for _, versions in g["turns"]:
                for v, c in versions:
                    total[v] = total.get(v, 0) + c
            assert sorted(total.items()) == [tuple(x) for x in g["versions"]]
    report = audit(tmp_path, 1)
    assert report.ok and report.groups_trained == 8 and report.violations == 0
    batch = trainer.batches[0]
    mask = np.asarray(batch.loss_mask)
    row = mask[0]
    assert 0 < row.sum() == 6 < np.count_nonzero(np.asarray(batch.tokens)[0])  # 3 turns x 2 model tokens
    assert controller.stats.episodes == 16 and controller.stats.episode_turns == 48 and controller.stats.env_tokens > 0
    lines = [json.loads(x) for x in (tmp_path / SAMPLES_FILE).read_text().splitlines()]
    assert len(lines) == 4 * 3 and {x["step"] for x in lines} == {0, 1, 2, 3}
    first = lines[0]
    assert [m["role"] for m in first["messages"]] == ["user", "assistant", "tool", "assistant", "tool", "assistant"]
    assert len(first["token_ids"]) == len(first["loss_mask"]) and sum(first["loss_mask"]) == 6
    assert first["reward"] == 1.0 and first["terms"] == {"turns": 3} and len(first["turns"]) == 3
    traced = [e for e in read_run_trace(tmp_path / TRACE_FILE) if e["event"] == "episode"]
    assert len(traced) == 16 and all(len(e["turns"]) == 3 and e["fault"] is None for e in traced)


def test_an_episode_fault_is_counted_and_its_sample_leaves_the_loss(tmp_path):
    controller, trainer = episode_controller(tmp_path, fault="raise", steps=2)
    result = run(controller)
    assert result.completed
    assert controller.stats.episode_faults == controller.stats.episodes == 8
    assert dict(controller.stats.episode_faults_by_kind) == {"env_error": 8}
    batch = trainer.batches[0]
    assert not np.asarray(batch.loss_mask).any() and set(np.asarray(batch.group_ids).tolist()) == {-1}
    assert audit(tmp_path, 1).ok
    line = json.loads((tmp_path / SAMPLES_FILE).read_text().splitlines()[0])
    assert line["fault"].startswith("env_error: step raised RuntimeError") and line["reward"] == 0.0


def test_too_many_faulted_episodes_stop_the_run_past_the_failure_gate(tmp_path):
    controller, trainer = episode_controller(tmp_path, fault="raise", steps=3, max_rate=0.5)
    try:
        run(controller)
    except ValueError as e:
        assert "max_reward_failure_rate" in str(e)
    else:
        raise AssertionError("the run trained on faulted episodes past the failure gate")
    assert trainer.batches == []
