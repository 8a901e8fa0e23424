"""What `resume=` does with the directory it is given (job/resume.py): a typo is an error that
creates nothing, an empty directory starts a fresh run and says so, a run that never saved a
checkpoint starts afresh with its files set aside, a fresh run never overwrites one."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from jaxrl_async.job.resume import check_resume_target, holds_run, start_resuming

LOGGER = "jaxrl_async.job.resume"


def warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER and r.levelno == logging.WARNING]


def killed_before_its_first_save(run_dir: Path) -> Path:
    run_dir.mkdir(parents=True)
    (run_dir / "ledger.jsonl").write_text('{"event": "admit"}\n')
    (run_dir / "metrics.jsonl").write_text("")
    return run_dir


def test_resume_to_a_path_that_holds_no_run_is_one_line_and_creates_nothing(tmp_path):
    typo = tmp_path / "runs" / "typo"
    with pytest.raises(ValueError) as info:
        check_resume_target(typo, str(typo))
    assert str(info.value) == (f"resume={typo}: does not exist (no ledger.jsonl, checkpoints/ or run.lock); pass "
                               "the directory of an earlier run, or drop resume= to start a fresh one")
    assert not (tmp_path / "runs").exists()
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match=r"^resume=\S+/empty: holds no run \(no ledger.jsonl"):
        check_resume_target(tmp_path / "empty", str(tmp_path / "empty"))
    assert list((tmp_path / "empty").iterdir()) == []


def test_resume_to_a_path_with_a_run_or_resume_true_anywhere_passes_the_target_check(tmp_path):
    check_resume_target(killed_before_its_first_save(tmp_path / "run"), str(tmp_path / "run"))
    check_resume_target(tmp_path / "hydra_dir", True)  # resume=true: the Hydra dir, checked below
    (tmp_path / "started").mkdir()
    (tmp_path / "started" / "run.lock").write_text("pid 1 on host\n")  # killed while it started
    assert holds_run(tmp_path / "started") and not holds_run(tmp_path / "hydra_dir")


def test_resume_true_on_a_directory_without_a_run_starts_a_fresh_one_there_and_says_so(tmp_path, caplog):
    hydra_dir = tmp_path / "run"
    (hydra_dir / ".hydra").mkdir(parents=True)  # what Hydra writes before the run starts
    (hydra_dir / "train.log").write_text("")
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert start_resuming(hydra_dir, True, leader=True) is False
    assert warnings(caplog) == [f"resume: {hydra_dir} holds no run yet; starting a fresh run there"]
    assert sorted(p.name for p in hydra_dir.iterdir()) == [".hydra", "train.log"]  # no attempts/, no checkpoints/


def test_a_run_without_a_checkpoint_starts_afresh_with_its_files_set_aside(tmp_path, caplog):
    run_dir = killed_before_its_first_save(tmp_path / "run")
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert start_resuming(run_dir, str(run_dir), leader=True) is False
    attempt = run_dir / "attempts" / "1"
    assert warnings(caplog) == [f"resume: no checkpoint in {run_dir / 'checkpoints'} (the run stopped before its "
                                f"first save); starting afresh, the earlier attempt's files are in {attempt}"]
    assert (attempt / "ledger.jsonl").read_text() == '{"event": "admit"}\n' and not (run_dir / "ledger.jsonl").exists()


def test_a_follower_decides_alike_and_moves_nothing(tmp_path, caplog):
    run_dir = killed_before_its_first_save(tmp_path / "run")
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert start_resuming(run_dir, True, leader=False) is False
    assert warnings(caplog) == [] and (run_dir / "ledger.jsonl").exists()


def test_a_fresh_run_on_a_directory_that_holds_a_ledger_is_refused(tmp_path):
    run_dir = killed_before_its_first_save(tmp_path / "run")
    with pytest.raises(ValueError, match=r"^hydra.run.dir=\S+: already holds a run; pass resume=true"):
        start_resuming(run_dir, None, leader=True)
    assert start_resuming(tmp_path / "other", False, leader=True) is False


def test_a_checkpoint_at_steps_is_finished_and_resumes_while_one_past_steps_is_refused():
    from jaxrl_async.job.resume import check_compatible, finished

    final = {"run": {"seed": 0}, "step": 30}
    assert check_compatible(final, {"seed": 0, "steps": 30}) == [] and finished(final, 30)
    assert not finished(final, 40)
    with pytest.raises(ValueError, match="^resume: steps=20 but the checkpointed run has trained 30 steps; "
                                         "pass steps=30 to finish it or a larger steps= to train on$"):
        check_compatible(final, {"seed": 0, "steps": 20})
