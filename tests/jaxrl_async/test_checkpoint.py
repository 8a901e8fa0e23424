"""Checkpoints: the orbax round trip, and a run stopped by SIGTERM that resumes without losing,
repeating or out-aging anything."""

import logging
import os
import signal
import time
from collections import Counter

import jax
import numpy as np
import pytest

import shutil

from jaxrl_async.checkpoint import MANIFEST_FILE, CheckpointDamaged, Checkpointer, truncate
from jaxrl_async.models.loading import load_model
from jaxrl_async.trainer.batch import pad_batch
from jaxrl_async.trainer.config import TrainerConfig
from jaxrl_async.trainer.trainer import Trainer
from planner.configs import build
from planner.ledger_audit import audit
from tests.helpers.engines import WithholdingEngine
from tests.helpers.filesystems import small_filesystem
from tests.helpers.train_runs import StepProbe, make_job, read_jsonl


def trained_trainer(steps: int) -> Trainer:
    trainer = Trainer(load_model("tiny").model, build(TrainerConfig, {"optim": {"lr": 1e-2}}, "trainer"))
    rows = [([1, 2, 3], [4, 5], [-1.0, -2.0], float(i % 2), i // 2) for i in range(8)]
    for _ in range(steps):
        trainer.step(pad_batch(rows))
    return trainer


def test_params_optimizer_state_version_and_meta_survive_a_round_trip(tmp_path):
    trainer = trained_trainer(2)
    ckpt = Checkpointer(tmp_path, keep=2)
    ckpt.save(2, trainer.state_dict(), {"step": 2, "policy": {"groups": [1, 2]}})
    expected = jax.tree.map(np.array, trainer.state_dict())
    trained_trainer(0)  # unrelated work while orbax writes
    ckpt.wait()
    fresh = trained_trainer(0)
    state, meta = Checkpointer(tmp_path).restore(fresh.state_dict())
    fresh.load_state_dict(state)
    assert meta == {"step": 2, "policy": {"groups": [1, 2]}, "trainer_version": 2}
    assert fresh.version == 2
    got = jax.tree.map(np.array, fresh.state_dict())
    assert jax.tree.all(jax.tree.map(np.array_equal, got, expected))


def test_a_checkpoint_saved_on_four_devices_restores_onto_a_two_device_mesh(tmp_path):
    from jaxrl_async.sharding import make_mesh

    rows = [([1, 2, 3], [4, 5], [-1.0, -2.0], float(i % 2), i // 2) for i in range(8)]
    cfg = build(TrainerConfig, {"optim": {"lr": 1e-2}}, "trainer")
    four = Trainer(load_model("tiny").model, cfg, mesh=make_mesh(fsdp=2, tensor=2))
    for _ in range(2):
        four.step(pad_batch(rows))
    ckpt = Checkpointer(tmp_path)
    ckpt.save(2, four.state_dict(), {"step": 2})
    ckpt.close()
    expected = jax.tree.map(np.array, four.state_dict())

    two = Trainer(load_model("tiny").model, cfg, mesh=make_mesh(fsdp=2))
    state, _ = Checkpointer(tmp_path).restore(two.state_dict())
    two.load_state_dict(state)
    wq = two.state_dict()["params"]["layers"]["wq"]
    assert len(wq.sharding.device_set) == 2 and wq.sharding.spec[1] == "fsdp"  # the new layout
    got = jax.tree.map(np.array, two.state_dict())
    assert not np.array_equal(expected["params"]["layers"]["wq"], np.array(trained_trainer(0).params()["layers"]["wq"]))
    assert jax.tree.all(jax.tree.map(np.array_equal, got, expected))
    two.step(pad_batch(rows))  # and it trains on from there
    assert two.version == 3


def test_only_the_newest_checkpoints_are_kept(tmp_path):
    trainer = trained_trainer(0)
    ckpt = Checkpointer(tmp_path, keep=2, every=3)
    for step in (3, 6, 9):
        ckpt.save(step, trainer.state_dict(), {"step": step})
    ckpt.close()
    assert sorted(int(p.name) for p in (tmp_path / "checkpoints").iterdir() if p.name.isdigit()) == [6, 9]
    assert ckpt.due(6) and not ckpt.due(7)


def test_a_second_save_of_the_same_step_keeps_the_first(tmp_path):
    """A stop right after the periodic save of step 3 saves step 3 again: no error, one resume point."""
    trainer = trained_trainer(0)
    ckpt = Checkpointer(tmp_path, every=3)
    ckpt.save(3, trainer.state_dict(), {"step": 3, "admitted": 0})
    ckpt.save(3, trainer.state_dict(), {"step": 3, "admitted": 2})
    ckpt.close()
    assert [p.name for p in (tmp_path / "checkpoints").iterdir() if p.name.isdigit()] == ["3"]
    assert Checkpointer(tmp_path).read_meta(3)["admitted"] == 0


def test_the_cadence_saves_after_the_first_step_then_every_n():
    ckpt = Checkpointer.__new__(Checkpointer)
    ckpt.every = 5
    assert [n for n in range(1, 16) if ckpt.due(n)] == [1, 5, 10, 15]
    ckpt.every = 0  # off: only the stop's and the end's saves
    assert not any(ckpt.due(n) for n in range(1, 16))


def test_a_save_interrupted_by_a_kill_is_ignored_and_cleaned_up(tmp_path):
    trainer = trained_trainer(0)
    ckpt = Checkpointer(tmp_path)
    ckpt.save(1, trainer.state_dict(), {"step": 1})
    ckpt.close()
    torn = tmp_path / "checkpoints" / "3.orbax-checkpoint-tmp"  # what a SIGKILL mid-save leaves
    (torn / "trainer").mkdir(parents=True)
    again = Checkpointer(tmp_path)
    assert again.latest_step() == 1 and again.read_meta() == {"step": 1, "trainer_version": 0}
    deadline = time.monotonic() + 30  # orbax removes it in the background (awaited before a save)
    while torn.exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not torn.exists()
    again.save(3, trainer.state_dict(), {"step": 3})  # the same step saves again without a clash
    again.close()
    assert Checkpointer(tmp_path).latest_step() == 3


def test_a_full_disk_at_save_time_is_one_line_naming_the_dir_and_errno(tmp_path, monkeypatch, caplog):
    import errno

    from jaxrl_async.checkpoint import CheckpointWriteError

    trainer = trained_trainer(0)
    ckpt = Checkpointer(tmp_path)
    makedirs = os.makedirs

    def full(path, *args, **kwargs):  # no full filesystem can be made here: the save's mkdir fails as on one
        if "orbax-checkpoint-tmp" in str(path):
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        return makedirs(path, *args, **kwargs)

    monkeypatch.setattr(os, "makedirs", full)
    ckpt.save(2, trainer.state_dict(), {"step": 2})  # asynchronous: the failure surfaces at the wait
    with pytest.raises(CheckpointWriteError) as info:
        ckpt.wait()
    assert str(info.value) == (f"checkpoint: cannot write {tmp_path / 'checkpoints'}: [Errno 28 ENOSPC] "
                               "No space left on device")
    ckpt.close()  # reported once: closing does not raise it again
    # orbax's own logs of it, each with a traceback, never reach a handler.
    assert not [r for r in caplog.records if r.exc_info], [r.getMessage() for r in caplog.records]


def test_a_really_full_disk_is_one_line_naming_the_dir_and_errno(tmp_path, caplog):
    """A 64 KiB tmpfs: the save fails in orbax's directory writes (OSError) or in tensorstore's
    array writes (a ValueError carrying the errno), whichever comes first; both are this line."""
    from jaxrl_async.checkpoint import CheckpointWriteError

    trainer = trained_trainer(0)
    assert sum(np.asarray(x).nbytes for x in jax.tree.leaves(trainer.state_dict())) > 64 * 1024  # it cannot fit
    with small_filesystem(tmp_path / "small") as mount:
        ckpt = Checkpointer(mount)
        with pytest.raises(CheckpointWriteError) as info:
            ckpt.save(2, trainer.state_dict(), {"step": 2})
            ckpt.wait()
        ckpt.close()
    assert str(info.value) == (f"checkpoint: cannot write {mount / 'checkpoints'}: [Errno 28 ENOSPC] "
                               "No space left on device")
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], [r.getMessage() for r in caplog.records]


def test_a_checkpoint_of_another_model_names_the_first_differing_array(tmp_path):
    from jaxrl_async.checkpoint import TreeMismatch
    from jaxrl_async.models.config import ModelConfig
    from jaxrl_async.models.loading import build_model

    ckpt = Checkpointer(tmp_path)
    ckpt.save(1, trained_trainer(0).state_dict(), {"step": 1})
    ckpt.close()
    other = Trainer(build_model(ModelConfig.tiny(intermediate_size=96)),
                    build(TrainerConfig, {"optim": {"lr": 1e-2}}, "trainer"))
    with pytest.raises(TreeMismatch, match=r"^params/layers/w_down is float32\[2, 128, 64\] in the checkpoint; "
                                           r"expected float32\[2, 96, 64\]$"):
        Checkpointer(tmp_path).restore(other.state_dict())


# ------------------------------------------------------------------ damaged checkpoints
@pytest.fixture(scope="module")
def two_checkpoints(tmp_path_factory):
    """Checkpoints of steps 1 and 2 (manifests written) and the trainer that saved them."""
    folder = tmp_path_factory.mktemp("saved")
    trainer = trained_trainer(1)
    ckpt = Checkpointer(folder)
    ckpt.save(1, trainer.state_dict(), {"step": 1})
    ckpt.save(2, trainer.state_dict(), {"step": 2})
    ckpt.close()
    return folder, trainer


def copy_of(two_checkpoints, tmp_path):
    shutil.copytree(two_checkpoints[0], tmp_path / "run")
    return tmp_path / "run", Checkpointer(tmp_path / "run")


def largest_data_file(step_dir):
    return max((p for p in (step_dir / "trainer").rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)


def test_every_finished_save_has_a_manifest_its_files_match(two_checkpoints, tmp_path):
    run, ckpt = copy_of(two_checkpoints, tmp_path)
    assert ckpt.all_steps() == [2, 1]
    assert all((run / "checkpoints" / str(s) / MANIFEST_FILE).exists() for s in (1, 2))
    assert ckpt.damage(2) is None and ckpt.damage(1) is None


def test_a_truncated_data_file_is_named_by_the_manifest_check(two_checkpoints, tmp_path):
    run, ckpt = copy_of(two_checkpoints, tmp_path)
    data = largest_data_file(run / "checkpoints" / "2")
    size = data.stat().st_size
    assert size > 1000  # the arrays' file, not a small index
    os.truncate(data, size // 2)
    name = str(data.relative_to(run / "checkpoints" / "2"))
    assert ckpt.damage(2) == f"{name}: {size // 2} bytes, the manifest recorded {size}"
    assert ckpt.damage(1) is None


def test_a_garbage_meta_of_the_same_size_fails_the_checksum(two_checkpoints, tmp_path):
    run, ckpt = copy_of(two_checkpoints, tmp_path)
    meta = run / "checkpoints" / "2" / "meta" / "metadata"
    meta.write_bytes(b"\x00" * meta.stat().st_size)
    assert ckpt.damage(2) == "meta/metadata: checksum differs from the manifest"


def test_a_missing_file_is_named(two_checkpoints, tmp_path):
    run, ckpt = copy_of(two_checkpoints, tmp_path)
    data = largest_data_file(run / "checkpoints" / "2")
    data.unlink()
    assert ckpt.damage(2) == f"{data.relative_to(run / 'checkpoints' / '2')}: missing"


def test_a_checkpoint_without_a_manifest_is_unverified_and_still_restores(two_checkpoints, tmp_path):
    run, ckpt = copy_of(two_checkpoints, tmp_path)  # as saved before manifests existed
    (run / "checkpoints" / "2" / MANIFEST_FILE).unlink()
    assert ckpt.damage(2) is None
    state, meta = ckpt.restore(two_checkpoints[1].state_dict(), 2)
    assert meta == {"step": 2, "trainer_version": 1} and state["version"] == 1


def test_a_damaged_checkpoint_without_a_manifest_fails_its_restore_in_one_line(two_checkpoints, tmp_path):
    run, ckpt = copy_of(two_checkpoints, tmp_path)
    step_dir = run / "checkpoints" / "2"
    (step_dir / MANIFEST_FILE).unlink()
    (step_dir / "meta" / "metadata").write_text("{not json")
    with pytest.raises(CheckpointDamaged) as info:
        ckpt.read_meta(2)
    assert str(info.value).startswith("checkpoints/2 is damaged (meta: ") and "\n" not in str(info.value)
    data = largest_data_file(step_dir)
    os.truncate(data, data.stat().st_size // 2)
    with pytest.raises(CheckpointDamaged) as info:
        ckpt.restore(two_checkpoints[1].state_dict(), 2)
    assert str(info.value).startswith("checkpoints/2 is damaged (trainer: ") and "\n" not in str(info.value)
    assert ckpt.restore(two_checkpoints[1].state_dict(), 1)[1]["step"] == 1  # the older one is whole


def test_a_damaged_checkpoint_set_aside_is_no_longer_listed_and_its_step_saves_afresh(two_checkpoints, tmp_path):
    run, ckpt = copy_of(two_checkpoints, tmp_path)
    os.truncate(largest_data_file(run / "checkpoints" / "2"), 10)
    assert ckpt.set_aside(2) == run / "checkpoints" / "2.damaged"
    assert ckpt.all_steps() == [1]
    ckpt.save(2, two_checkpoints[1].state_dict(), {"step": 2})  # not "already saved: kept"
    ckpt.close()
    again = Checkpointer(run)
    assert again.all_steps() == [2, 1] and again.damage(2) is None
    assert again.restore(two_checkpoints[1].state_dict(), 2)[1]["step"] == 2


def test_resume_without_a_checkpoint_is_a_one_line_error(tmp_path):
    with pytest.raises(ValueError, match="resume: no checkpoint in"):
        Checkpointer(tmp_path).restore(trained_trainer(0).state_dict())


def test_logs_are_cut_back_to_the_checkpoint(tmp_path):
    log = tmp_path / "ledger.jsonl"
    log.write_text('{"a": 1}\n{"b": 2}\n')
    truncate(log, 9)
    assert log.read_text() == '{"a": 1}\n'
    with pytest.raises(ValueError, match="fewer than the 100 the checkpoint recorded"):
        truncate(log, 100)


@pytest.mark.slow
def test_a_run_stopped_by_sigterm_resumes_with_the_same_ledger_and_a_clean_audit(tmp_path):
    steps, stop_after = 10, 3
    common = [f"steps={steps}", "batch_groups=2", "group_size=4", "max_new_tokens=4", "max_staleness=2"]
    # η = 2, B = 2: groups 8 and 9 are admitted once v2 is synced (after step 1), before the stop.
    # Their pieces never reach the controller, so they are surely in flight at the stop, however
    # fast the engine is (otherwise every group may be done by then, and a resume that regenerated
    # nothing would pass: the counts below would all be zero).
    stuck = {"8.0", "9.0"}

    job = make_job(tmp_path, common)
    job.controller.engine = WithholdingEngine(job.controller.engine, lambda request_id: request_id in stuck)

    def sigterm_after(record):
        if record["step"] == stop_after - 1:
            os.kill(os.getpid(), signal.SIGTERM)  # the real signal path: the loop's handler

    job.controller.sinks.append(StepProbe(sigterm_after))
    first = job.run()
    # A signal lands asynchronously: the run stops at the first step boundary after it arrives.
    assert not first["completed"] and stop_after <= first["steps"] < steps
    ledger = read_jsonl(tmp_path / "ledger.jsonl")
    assert sum(e["event"] == "train" for e in ledger) == first["steps"]
    untrained_at_stop = {e["uid"] for e in ledger if e["event"] == "admit"} - {
        g["uid"] for e in ledger if e["event"] == "train" for g in e["groups"]}
    generating_at_stop = {uid for uid, g in job.controller.table.groups.items() if g.phase_name != "done"}
    assert {8, 9} <= generating_at_stop <= untrained_at_stop  # really in flight at the stop
    assert job.controller.engine.withheld == stuck

    resumed = make_job(tmp_path, common + ["resume=true"])
    second = resumed.run()
    assert second["completed"] and second["steps"] == steps  # the count continues: same total as one run
    report = audit(tmp_path, 2)
    assert report.ok, report.verdict()
    assert report.steps == steps and report.groups_trained == 2 * steps
    assert not report.trained_twice and not report.lost and report.groups_dropped == 0
    assert report.max_token_staleness <= 2
    ledger = read_jsonl(tmp_path / "ledger.jsonl")
    trains = [e["step"] for e in ledger if e["event"] == "train"]
    assert trains == list(range(steps))
    # Groups generating at the stop were regenerated (a second `admit`) and trained once; done
    # ones kept their samples (one `admit`); the run trained uids 0..2·steps−1 exactly once, as an
    # uninterrupted run does.
    assert second["groups_readmitted"] == report.readmissions == len(generating_at_stop) >= 2
    admits = Counter(e["uid"] for e in ledger if e["event"] == "admit")
    assert admits == Counter({**{u: 1 for u in range(2 * steps)}, **{u: 2 for u in generating_at_stop}})
    assert Counter(g["uid"] for e in ledger if e["event"] == "train" for g in e["groups"]) == Counter(range(2 * steps))
    assert second["groups_admitted"] == 2 * steps
    assert [m["step"] for m in read_jsonl(tmp_path / "metrics.jsonl")] == list(range(steps))
    # Fewer steps than the checkpoint holds: refused.
    with pytest.raises(ValueError, match=f"steps={steps - 1} but the checkpointed run has trained {steps} steps; "
                                         f"pass steps={steps} to finish it or a larger steps= to train on"):
        make_job(tmp_path, [*common[1:], f"steps={steps - 1}", "resume=true"])


def test_orbax_reads_abandoned_by_a_failed_restore_are_not_reported_and_other_unraisables_are():
    """A damaged checkpoint's restore abandons orbax's other array reads; Python reports each as it
    collects it ("Exception ignored in: <coroutine ...>" with a TensorStore spec dump). The
    `CheckpointDamaged` line says it already, so the hook drops those and nothing else."""
    from types import SimpleNamespace

    from jaxrl_async.checkpoint import _drop_abandoned_orbax_io

    reported = []
    hook = _drop_abandoned_orbax_io(reported.append)
    read = SimpleNamespace(exc_value=Exception("Encountered error while reading array index: (slice(0, 2, 1),). "
                                               "See full TensorStore details: ..."))
    other = SimpleNamespace(exc_value=ValueError("a user's coroutine failed"))
    hook(read)
    hook(other)
    assert reported == [other]
