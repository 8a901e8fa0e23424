"""benchmarks/bench_memory.py's side-by-side mode: `--trl-python` refuses what would not be the same
run before anything runs, and the TRL row lands in the same table as the project's runs."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))

import bench_memory  # noqa: E402  (a script folder, not a package)

TIME_V = ("\tUser time (seconds): 101.50\n\tSystem time (seconds): 17.25\n"
          "\tMaximum resident set size (kbytes): 3586048\n")


def test_time_v_gives_the_peak_rss_in_gib_and_the_cpu_seconds():
    assert bench_memory.max_rss_gib(TIME_V) == pytest.approx(3586048 / 2**20)
    assert bench_memory.cpu_seconds(TIME_V) == pytest.approx(118.75)


def test_a_missing_trl_python_stops_before_any_run(tmp_path):
    with pytest.raises(SystemExit, match=r"--trl-python .*nope does not exist"):
        bench_memory.main(["--steps", "2", "--trl-python", str(tmp_path / "nope")])


def test_overrides_with_trl_python_are_refused_as_not_the_same_run(tmp_path):
    python = tmp_path / "python"
    python.touch()
    with pytest.raises(SystemExit, match=r"--trl-python with overrides \['trainer.remat=none'\]"):
        bench_memory.main(["--trl-python", str(python), "--", "trainer.remat=none"])


def test_the_side_by_side_table_has_a_row_per_project_run_then_trls(tmp_path):
    run = {"peak_rss_gib": 6.65, "step_s_median": 12.6, "step_s_range": (12.0, 27.8), "wall_s": 300.0,
           "cpu_s": 500.0, "load": 5.2}
    trl = {**run, "peak_rss_gib": 3.42, "step_s_median": 63.3, "versions": {"trl": "1.16.0"},
           "gradient_checkpointing": False}
    table = bench_memory.side_by_side([run, run], trl).splitlines()
    assert table[0] == "| trainer | peak RSS GiB | step s median | wall s |" and len(table) == 5
    assert table[2].startswith("| jaxrl-async (run 0") and "| 6.65 | 12.60 | 300 |" in table[2]
    assert table[4].startswith("| TRL 1.16.0 GRPOTrainer") and "| 3.42 | 63.30 | 300 |" in table[4]
    assert "gradient checkpointing off" in table[4]
    out = tmp_path / "memory.md"
    bench_memory.table_row(out, "main", "smollm2_products12", 5, "", run)
    bench_memory.table_row(out, "trl", "smollm2_products12", 5, "trl GRPOTrainer", trl)
    lines = out.read_text().splitlines()
    assert len(lines) == 4 and lines[3].startswith("| trl | smollm2_products12 | 5 | trl GRPOTrainer | 3.42 |")
