"""The controller's checkpoint state: a snapshot the controller produces and accepts, and its JSON."""

import ast
import json
from pathlib import Path

import pytest

from jaxrl_async.runtime import state
from jaxrl_async.runtime.groups import GENERATING, LiveGroup
from jaxrl_async.runtime.rollouts import GroupRollout, RolloutSample
from planner.types import GroupState
from tests.helpers.train_runs import make_job

PROMPT = {"prompt_id": "p3", "text": "say a", "prompt_ids": [5, 6, 7], "answer": "a", "meta": {"content": "a"}}
STATS = {"elapsed_s": 12.5, "trainer_busy_s": 4.0, "generator_busy_s": 9.0, "overlap_s": 2.0, "steps_done": 3,
         "steps_skipped": 0, "groups_admitted": 9, "groups_readmitted": 1, "groups_trained": 6, "groups_dropped": 0,
         "tokens_generated": 80, "tokens_trained": 60, "tokens_wasted": 0, "rewards_scored": 24, "reward_errors": 0,
         "pushes": 3, "push_s": 0.3, "push_max_s": 0.2, "last_push_s": 0.1, "staleness": {"0": 20, "1": 40}}
# A checkpoint's JSON as the controller has always written it.
OLD_META = {
    "run": {"policy": "lookahead", "batch_groups": 2, "group_size": 2, "max_staleness": 1, "seed": 0},
    "step": 3, "version": 3, "next_uid": 11, "policy": {"admitted": [7, 8]}, "stream": {"position": 11},
    "window": [[9, PROMPT], [10, {**PROMPT, "prompt_id": "p4"}]],
    "groups": [
        {"prompt": PROMPT, "phase": "done",
         "rollout": {"uid": 7, "prompt_id": "p3", "prompt_ids": [5, 6, 7], "attempt": 0, "rewards": [1.0, 0.0],
                     "reward_errors": 0, "samples": [[[1, 2], [-0.5, -0.25], [[2, 1], [3, 1]], "stop"],
                                                     [[3], [-1.0], [[3, 1]], "length"]]}},
        {"prompt": PROMPT, "phase": "generating",
         "rollout": {"uid": 8, "prompt_id": "p3", "prompt_ids": [5, 6, 7], "attempt": 1, "rewards": None,
                     "reward_errors": 0, "samples": [[[4], [-0.1], [[3, 1]], None], [[], [], [], None]]}},
    ],
    "stats": STATS, "ledger_bytes": 1234, "metrics_bytes": 567,
}


def test_an_old_checkpoints_json_loads_into_a_snapshot_and_writes_back_unchanged():
    snap = state.from_json(json.loads(json.dumps(OLD_META)))
    assert snap.step == 3 and [uid for uid, _ in snap.window] == [9, 10]
    assert [(g.rollout.uid, g.phase) for g in snap.groups] == [(7, "done"), (8, "generating")]
    assert snap.groups[0].rollout.token_versions() == [(2, 1), (3, 2)]
    # Keys newer than the checkpoint come back at their defaults; every old key is unchanged.
    new_stats = {"groups_stalled": 0, "groups_migrated": 0, "reward_errors_by_type": {}, "engine_iterations": 0,
                 "speculation_drafted_tokens": 0, "speculation_accepted_tokens": 0, "speculating_sequences": 0,
                 "episodes": 0, "episode_turns": 0, "env_tokens": 0, "env_s": 0.0, "episode_faults": 0,
                 "episode_faults_by_kind": {}}
    assert json.loads(json.dumps(state.to_json(snap))) == {**OLD_META, "stats": {**STATS, **new_stats},
                                                           "trace_bytes": None, "samples_bytes": None}


def test_state_converts_snapshots_and_never_imports_the_controller():
    tree = ast.parse(Path(state.__file__).read_text())
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    imported |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert not any("controller" in m for m in imported), imported


@pytest.mark.slow
def test_a_controller_restored_from_its_snapshot_snapshots_the_same_and_regenerates_what_was_generating(tmp_path):
    overrides = ["steps=4", "batch_groups=2", "group_size=2", "max_new_tokens=4"]
    ctrl = make_job(tmp_path / "a", overrides).controller
    ctrl.table.refill(ctrl.stream)
    (c_done, p_done), (c_gen, p_gen) = ctrl.table.window.pop(0), ctrl.table.window.pop(0)
    done = GroupRollout(c_done.uid, p_done.prompt_id, p_done.prompt_ids,
                        [RolloutSample([1, 2], [-0.5, -0.5], [[0, 2]], "stop"),
                         RolloutSample([3], [-1.0], [[0, 1]], "length")],
                        started=True, rewards=[1.0, 0.0])
    generating = GroupRollout(c_gen.uid, p_gen.prompt_id, p_gen.prompt_ids,
                              [RolloutSample([4], [-0.2], [[0, 1]]), RolloutSample()], started=True)
    ctrl.table.groups = {c_done.uid: LiveGroup(p_done, done, GroupState.DONE),
                         c_gen.uid: LiveGroup(p_gen, generating, scoring=True)}
    ctrl.step = ctrl.version = 1

    saved = state.to_json(ctrl.snapshot())
    done.samples[0].token_ids.append(99)  # the run goes on: the snapshot does not change
    assert state.to_json(ctrl.snapshot()) != saved and json.loads(json.dumps(saved)) == saved
    assert saved["groups"][0]["rollout"]["samples"][0][0] == [1, 2]

    fresh = make_job(tmp_path / "b", overrides).controller
    fresh.restore(state.from_json(saved))
    assert state.to_json(fresh.snapshot()) == {**saved, "groups": [saved["groups"][0],
                                                                  {**saved["groups"][1], "phase": GENERATING}]}
    assert fresh.table.lost_on_resume == [c_gen.uid] and fresh.table.groups[c_done.uid].state == GroupState.DONE
    assert [c.uid for c, _ in fresh.table.window] == [c.uid for c, _ in ctrl.table.window]
