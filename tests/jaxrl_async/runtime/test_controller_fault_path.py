"""The controller's fault and resume path, in local mode, deterministic and fast (no JAX, no Ray).

The real controller, policy, ledger, task and stream; a scripted engine whose requests the test
holds or releases and an instant trainer (tests/helpers/controller_harness.py). What is pinned:
the start barrier of a re-admission (a request waits until the engine holds its version), the
regeneration of lost requests (stale ids ignored, a policy that loses a group is an error), drops,
and a stop/resume with groups really in flight that regenerates exactly those, once, and trains
every prompt of an uninterrupted run exactly once (checked by planner.audit).
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter

import pytest

from jaxrl_async.checkpoint import truncate
from jaxrl_async.engines.base import GenerationRequest
from jaxrl_async.runtime.requests import sampling_seed
from jaxrl_async.runtime.groups import DONE
from jaxrl_async.runtime.metrics import METRICS_FILE
from jaxrl_async.runtime.outbox import Abort, Submit
from jaxrl_async.runtime.state import from_json, to_json
from planner.ledger import LEDGER_FILE
from planner.ledger_audit import audit
from planner.types import Admission, Decision, Drop, GroupState
from tests.helpers.controller_harness import InstantTrainer, MemoryCheckpointer, ScriptedEngine, make_controller, run
from tests.helpers.train_runs import StepProbe, read_jsonl


def admits(run_dir) -> Counter:
    return Counter(e["uid"] for e in read_jsonl(run_dir / LEDGER_FILE) if e["event"] == "admit")


def trained(run_dir) -> Counter:
    return Counter(g["uid"] for e in read_jsonl(run_dir / LEDGER_FILE) if e["event"] == "train" for g in e["groups"])


def admit_first_candidate(c):
    """Admit the stream's first prompt through the policy, as `_settle` does; its uid."""
    c.table.refill(c.stream)
    decision = c.policy.admit(now=0.0, candidates=[c.table.window[0][0]])
    c._apply(decision, "admit")
    return decision.admit[0].uid


def submits(c) -> list[str]:
    return [cmd.request.request_id for cmd in c._outbox.commands if isinstance(cmd, Submit)]


def aborts(c) -> list[str]:
    return [cmd.request_id for cmd in c._outbox.commands if isinstance(cmd, Abort)]


def held(c) -> list[tuple[int, GenerationRequest]]:
    """The requests the outbox holds at their start barrier: (barrier, request)."""
    return [(cmd.barrier, cmd.request) for cmd in c._outbox.held]


def forget_commands(c) -> None:
    """Drop the queued engine calls, as if they had been sent."""
    c._outbox._commands.clear()


def sync(c, version: int) -> None:
    """The engine now holds `version`, as the controller's `_train` reports it to the outbox."""
    c._outbox.synced_to(version, still_wanted=c._collector.is_open)


# ---------------------------------------------------------------------------------- admission and the start barrier


def test_a_fresh_admission_is_submitted_at_once_with_its_attempts_seed_and_ledger_line(tmp_path):
    c = make_controller(tmp_path)
    uid = admit_first_candidate(c)
    assert submits(c) == [f"{uid}.0"] and aborts(c) == [] and held(c) == []
    request = c._outbox.commands[0].request
    assert request.sampling.seed == sampling_seed(0, uid, 0) and request.sampling.n == 2
    assert (request.sampling.temperature, request.sampling.top_p, request.sampling.max_new_tokens,
            request.sampling.stop_token_ids) == (0.9, 0.95, 4, (0,))  # the run's sampling settings
    assert request.prompt_ids == c.table.groups[uid].prompt.prompt_ids and request.priority == 1.0  # deadline 0 + η
    assert c.table.groups[uid].rollout.prompt_id == c.table.groups[uid].prompt.prompt_id
    assert c.stats.groups_admitted == 1 and c.stats.groups_readmitted == 0 and c.table.window[0][0].uid != uid
    c.ledger.flush()
    assert read_jsonl(tmp_path / LEDGER_FILE) == [
        {"event": "admit", "uid": uid, "version": 0, "deadline": 1, "prompt": c.table.groups[uid].prompt.prompt_id}]


def test_a_regenerated_group_started_on_newer_weights_waits_for_them_then_is_submitted_once(tmp_path):
    """Lookahead re-admits a group at its first start version (the barrier); the controller holds
    the new request while its engine is older, and submits it once the engine holds that version."""
    c = make_controller(tmp_path, max_staleness=2)
    uid = admit_first_candidate(c)
    forget_commands(c)
    # A worker already on v1 started it (a Ray worker synced before the others; the engine here: v0).
    c._apply(c.policy.on_group_started(uid=uid, version=1, now=0.0), "on_group_started")
    c._apply(c.policy.on_tokens(uid=uid, version=1, tokens=3, now=0.0), "on_tokens")
    c._regenerate(uid)
    assert aborts(c) == [f"{uid}.0"] and submits(c) == []  # the old attempt aborted, the new one held
    g = c.policy.groups[uid]
    assert g.versions == {} and g.start_version is None  # regenerated from scratch, not resumed
    assert [(v, r.request_id) for v, r in held(c)] == [(1, f"{uid}.1")]
    assert held(c)[0][1].sampling.seed == sampling_seed(0, uid, 1)
    assert c.stats.groups_readmitted == 1 and c.stats.groups_admitted == 1 and not c.table.is_lost(uid)
    assert not c._collector.is_open(f"{uid}.0") and c._collector.is_open(f"{uid}.1")
    forget_commands(c)
    sync(c, 0)  # still on v0
    assert submits(c) == [] and len(held(c)) == 1
    sync(c, 1)
    assert submits(c) == [f"{uid}.1"] and held(c) == [] and c.version == 1
    sync(c, 1)
    assert submits(c) == [f"{uid}.1"]  # released once
    c.ledger.flush()
    lines = [e for e in read_jsonl(tmp_path / LEDGER_FILE) if e["event"] == "admit"]
    assert [(e["version"], e["deadline"]) for e in lines] == [(0, 2), (1, 3)]  # the deadline moved later with it


def test_a_barrier_equal_to_the_engines_version_is_met_and_submitted_at_once(tmp_path):
    c = make_controller(tmp_path)
    uid = admit_first_candidate(c)
    c.version = 3
    c.table.lose(uid)
    forget_commands(c)
    c.admit_group(Admission(uid, c.table.groups[uid].prompt.prompt_id, version=3, deadline=4, priority=4.0))
    assert aborts(c) == [f"{uid}.0"] and submits(c) == [f"{uid}.1"] and held(c) == []
    c.table.lose(uid)
    c.admit_group(Admission(uid, c.table.groups[uid].prompt.prompt_id, version=4, deadline=5, priority=5.0))
    assert submits(c) == [f"{uid}.1"] and [r.request_id for _, r in held(c)] == [f"{uid}.2"]
    assert c.table.groups[uid].rollout.attempt == 2 and c.stats.groups_readmitted == 2


def test_a_held_request_whose_group_was_dropped_meanwhile_is_never_submitted(tmp_path):
    c = make_controller(tmp_path)
    first, second = admit_first_candidate(c), admit_first_candidate(c)
    forget_commands(c)
    for uid, barrier in ((first, 2), (second, 1)):
        c.table.lose(uid)
        c.admit_group(Admission(uid, c.table.groups[uid].prompt.prompt_id, version=barrier, deadline=barrier + 1))
    assert c.stats.groups_admitted == 2 and c.stats.groups_readmitted == 2
    c.drop_group(Drop(first, 0, "test"))
    forget_commands(c)
    sync(c, 2)
    assert submits(c) == [f"{second}.1"] and held(c) == []  # the dropped one leaves the list too


# ---------------------------------------------------------------------------------- drops


def test_dropping_a_generating_group_aborts_it_and_counts_its_tokens_as_waste(tmp_path):
    c = make_controller(tmp_path)
    generating, done = admit_first_candidate(c), admit_first_candidate(c)
    c.table.groups[generating].rollout.samples[0].token_ids = [1, 2, 3]
    c.table.groups[done].state = GroupState.DONE
    c.table.groups[done].rollout.samples[1].token_ids = [4]
    c.table.lose(generating)
    forget_commands(c)
    c._ask = False
    c.drop_group(Drop(generating, 0, "lost"))
    assert aborts(c) == [f"{generating}.0"] and generating not in c.table.groups and not c.table.is_lost(generating)
    assert not c._collector.is_open(f"{generating}.0") and c._ask
    c.drop_group(Drop(done, 0, "end_of_run"))
    assert aborts(c) == [f"{generating}.0"]  # a done group has no request left to abort
    assert c.stats.groups_dropped == 2 and c.stats.tokens_wasted == 4 and c.table.groups == {}
    c.ledger.flush()
    drops = [(e["uid"], e["reason"], e["tokens"]) for e in read_jsonl(tmp_path / LEDGER_FILE) if e["event"] == "drop"]
    assert drops == [(generating, "lost", 3), (done, "end_of_run", 1)]


# ---------------------------------------------------------------------------------- lost requests in a running run


def test_lost_requests_are_regenerated_once_and_stale_ids_are_ignored(tmp_path):
    engine = ScriptedEngine(hold=lambda r: r.request_id == "3.0")
    c = make_controller(tmp_path, steps=4, engine=engine)

    def lose(record):
        if record["step"] == 0:
            assert c.table.groups[3].generating  # really in flight: the engine holds it
            c.on_requests_lost(["3.0", "0.0", "99.0"])  # 0 is trained, 99 never existed
        elif record["step"] == 1:
            c.on_requests_lost(["3.0"])  # the superseded attempt: nothing to redo

    c.sinks.append(StepProbe(lose))
    result = run(c)
    assert result.completed and result.stats.groups_readmitted == 1
    assert engine.submitted.count("3.1") == 1 and "3.2" not in engine.submitted and "3.0" in engine.aborted
    assert admits(tmp_path) == Counter({**{u: 1 for u in range(8)}, 3: 2})
    assert trained(tmp_path) == Counter(range(8))
    report = audit(tmp_path, 1)
    assert report.ok and report.readmissions == 1 and report.groups_dropped == 0, report.verdict()


def test_a_policy_that_neither_readmits_nor_drops_a_lost_group_stops_the_run_naming_it(tmp_path):
    engine = ScriptedEngine(hold=lambda r: r.request_id == "3.0")
    c = make_controller(tmp_path, steps=4, engine=engine)
    c.policy.on_group_lost = lambda **kw: Decision()
    c.sinks.append(StepProbe(lambda r: c.on_requests_lost(["3.0"]) if r["step"] == 0 else None))
    with pytest.raises(RuntimeError, match=r"on_group_lost\(uid=3\) neither re-admitted nor dropped"):
        run(c)


def test_a_policy_whose_fault_decision_is_invalid_is_named_with_the_call_that_returned_it(tmp_path):
    c = make_controller(tmp_path)
    uid = admit_first_candidate(c)
    c.policy.on_group_lost = lambda uid, **kw: Decision(train=[uid])
    with pytest.raises(ValueError, match="policy lookahead: on_group_lost returned a batch; only select_batch may"):
        c._regenerate(uid)


def test_a_policy_may_drop_a_lost_group_instead(tmp_path):
    c = make_controller(tmp_path)
    uid = admit_first_candidate(c)
    c.table.groups[uid].rollout.samples[1].token_ids = [5, 6]
    c.policy.on_group_lost = lambda uid, **kw: Decision(drop=[c.policy.drop(uid, "lost")])
    forget_commands(c)
    c._regenerate(uid)  # no error: the group is accounted for
    assert aborts(c) == [f"{uid}.0"] and submits(c) == [] and uid not in c.table.groups and not c.table.is_lost(uid)
    assert c.stats.groups_dropped == 1 and c.stats.tokens_wasted == 2 and c.stats.groups_readmitted == 0
    c.ledger.flush()
    assert [(e["uid"], e["reason"], e["tokens"]) for e in read_jsonl(tmp_path / LEDGER_FILE)
            if e["event"] == "drop"] == [(uid, "lost", 2)]


# ---------------------------------------------------------------------------------- snapshots, stop and resume


HELD = {4, 5}  # admitted before the stop, held by the engine: in flight at the stop
ETA = 2  # groups of two later steps are admitted at the stop: some done, some (HELD) generating


def stopped_run(run_dir, steps=6, stop_at=1):
    """Segment one: a run stopped at the end of step `stop_at` while the engine holds HELD's first attempts."""
    engine = ScriptedEngine(hold=lambda r: int(r.request_id.split(".")[0]) in HELD)
    ckpt = MemoryCheckpointer()
    c = make_controller(run_dir, steps=steps, engine=engine, checkpointer=ckpt, max_staleness=ETA)
    c.sinks.append(StepProbe(lambda r: c.request_stop() if r["step"] == stop_at else None))
    result = run(c)
    return c, ckpt, result


def resume(run_dir, meta, steps=6, checkpointer=None):
    """Segment two: what `TrainJob` does on resume=true — cut the logs back to the checkpoint, restore."""
    truncate(run_dir / LEDGER_FILE, meta["ledger_bytes"])
    truncate(run_dir / METRICS_FILE, meta["metrics_bytes"])
    engine = ScriptedEngine()
    c = make_controller(run_dir, steps=steps, engine=engine, checkpointer=checkpointer, resuming=True,
                        max_staleness=ETA)
    c.trainer = InstantTrainer(meta["step"])
    c.load_checkpoint_meta(meta)
    return c, engine


def test_a_stopped_run_resumes_regenerating_exactly_its_in_flight_groups_and_trains_every_prompt_once(tmp_path):
    whole = tmp_path / "whole"
    assert run(make_controller(whole, steps=6, max_staleness=ETA)).completed
    cut = tmp_path / "cut"
    first, ckpt, result = stopped_run(cut)
    assert not result.completed and result.steps_done == 2
    (step, trainer_state, meta), = ckpt.saves
    assert step == 2 and trainer_state == {"version": 2} and meta["step"] == 2 and meta["version"] == 2
    # The save holds the groups in flight (HELD by the engine, and any still being scored: scoring
    # runs beside the step) and the done ones, with their samples.
    phases = {g["rollout"]["uid"]: g["phase"] for g in meta["groups"]}
    in_flight = {uid for uid, phase in phases.items() if phase != DONE}
    done_at_stop = {uid for uid, phase in phases.items() if phase == DONE}
    assert HELD <= in_flight  # non-trivial: groups really were in flight at the stop
    assert in_flight | done_at_stop == set(range(4, 4 + len(phases)))  # every admitted, untrained group
    assert meta["ledger_bytes"] == (cut / LEDGER_FILE).stat().st_size > 0  # flushed before it was measured
    assert meta["metrics_bytes"] == (cut / METRICS_FILE).stat().st_size > 0
    assert meta["run"] == {"policy": "lookahead", "batch_groups": 2}  # what a resume must match
    assert meta["stats"]["elapsed_s"] > 0 and meta["stats"]["generator_busy_s"] > 0  # this segment's time counted
    saved_versions = {g["rollout"]["uid"]: g["rollout"]["samples"] for g in meta["groups"]}

    second, engine = resume(cut, meta)
    assert second.table.lost_on_resume == sorted(in_flight) and second.step == 2 and second.version == 2
    assert set(second.table.generating()) == in_flight
    result = run(second)
    assert result.completed and result.steps_done == 6
    assert engine.pushes[0] == 2  # the engine got the checkpoint's weights before anything ran
    assert sorted(r for r in engine.submitted if r.split(".")[0] in {str(u) for u in in_flight}) == \
        sorted(f"{u}.1" for u in in_flight)  # regenerated: a new attempt each, submitted once
    report = audit(cut, ETA)
    assert report.ok and report.steps == 6 and report.groups_trained == 12, report.verdict()
    assert report.readmissions == len(in_flight) == result.stats.groups_readmitted
    assert not report.lost and not report.trained_twice and report.groups_dropped == 0
    assert admits(cut) == Counter({**{u: 1 for u in range(12)}, **{u: 2 for u in in_flight}})
    # Exactly the prompts of the uninterrupted run, each trained once.
    assert trained(cut) == trained(whole) == Counter(range(12))
    groups_by_uid = {g["uid"]: g for e in read_jsonl(cut / LEDGER_FILE) if e["event"] == "train" for g in e["groups"]}
    for uid in done_at_stop:  # done groups kept their samples: no second attempt, the same token versions
        versions = Counter()
        for _, _, runs, _ in saved_versions[uid]:
            for v, n in runs:
                versions[v] += n
        assert sorted(map(tuple, groups_by_uid[uid]["versions"])) == sorted(versions.items())
    assert [m["step"] for m in read_jsonl(cut / METRICS_FILE)] == list(range(6))


def test_a_resume_stopped_before_its_first_step_saves_at_once_with_the_in_flight_groups_readmitted(tmp_path):
    _, ckpt, _ = stopped_run(tmp_path)
    meta = ckpt.latest_meta
    again = MemoryCheckpointer()
    second, engine = resume(tmp_path, meta, checkpointer=again)
    second.request_stop()
    result = run(second)
    assert not result.completed and result.steps_done == 2 and len(again.saves) == 1
    saved = again.latest_meta
    regenerated = {g["rollout"]["uid"]: g["rollout"]["attempt"] for g in saved["groups"] if g["phase"] != DONE}
    in_flight = {g["rollout"]["uid"] for g in meta["groups"] if g["phase"] != DONE}
    assert saved["step"] == 2 and regenerated == {u: 1 for u in in_flight} and HELD <= in_flight
    assert admits(tmp_path)[4] == admits(tmp_path)[5] == 2 and audit(tmp_path, ETA).lost == sorted(
        {g["rollout"]["uid"] for g in saved["groups"]})  # untrained but saved: the next resume trains them


def test_restoring_twice_keeps_only_the_second_snapshots_in_flight_groups(tmp_path):
    _, ckpt, _ = stopped_run(tmp_path)
    meta = ckpt.latest_meta
    c = make_controller(tmp_path / "fresh")
    c.load_checkpoint_meta(meta)
    c.load_checkpoint_meta({**meta, "groups": [g for g in meta["groups"] if g["phase"] == DONE]})
    assert c.table.lost_on_resume == [] and all(g.state == GroupState.DONE for g in c.table.groups.values())


def test_a_snapshot_shares_nothing_the_run_goes_on_changing(tmp_path):
    c = make_controller(tmp_path)
    uid = admit_first_candidate(c)
    c.table.groups[uid].rollout.samples[0].token_ids.append(7)
    snap = c.snapshot()
    before = json.dumps(to_json(snap))
    c.table.groups[uid].rollout.samples[0].token_ids.append(8)
    c.stats.groups_trained += 5
    c.stats.add_batch({0: 3})  # the histogram is a dict inside the stats
    c.policy.step += 1
    c.table.window.clear()
    assert json.dumps(to_json(snap)) == before
    assert snap.next_uid == c.table.next_uid and [u for u, _ in snap.window] and snap.groups[0].phase == "generating"


def test_without_a_checkpointer_a_stop_saves_nothing_and_still_ends(tmp_path):
    c = make_controller(tmp_path, steps=6)
    c.sinks.append(StepProbe(lambda r: c.request_stop() if r["step"] == 0 else None))
    result = run(c)
    assert not result.completed and result.steps_done == 1


def test_a_stop_requested_while_the_trainer_waits_saves_at_once(tmp_path):
    engine = ScriptedEngine(hold=lambda r: True)  # nothing ever finishes: the trainer waits at step 0
    ckpt = MemoryCheckpointer()
    c = make_controller(tmp_path, engine=engine, checkpointer=ckpt)

    async def main():
        task = asyncio.ensure_future(c.run())
        while len(engine.submitted) < 4:
            await asyncio.sleep(0.01)
        c.request_stop()
        return await asyncio.wait_for(task, 10)

    result = asyncio.run(main())
    assert result.steps_done == 0 and not result.completed
    assert [s for s, _, _ in ckpt.saves] == [0] and len(ckpt.latest_meta["groups"]) == 4


def test_a_restored_controller_shares_nothing_with_the_snapshot_it_came_from(tmp_path):
    _, ckpt, _ = stopped_run(tmp_path)
    snap = from_json(ckpt.latest_meta)
    before = json.dumps(to_json(snap))
    c = make_controller(tmp_path / "fresh")
    c.restore(snap)
    for g in c.table.groups.values():
        g.rollout.samples[0].token_ids.append(9)
    c.stats.add_batch({1: 4})
    c.stats.groups_trained += 1
    assert json.dumps(to_json(snap)) == before
