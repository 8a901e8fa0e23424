"""The progress display: plain lines off a terminal, a rich panel on one."""

import io

from jaxrl_async.runtime.progress import ProgressDisplay

RECORD = {"step": 4, "reward_mean": 0.5, "loss": 0.01, "max_staleness_in_batch": 1, "tokens_per_s": 900.0,
          "staleness_hist": {"0": 10, "1": 30}, "generator_busy": 0.4, "trainer_busy": 0.8, "eta_s": 75.0,
          "elapsed_s": 20.0, "skipped": 0}


def test_off_a_terminal_each_step_is_one_plain_line_with_reward_staleness_busy_and_eta():
    out = io.StringIO()
    display = ProgressDisplay(total_steps=10, policy="lookahead", max_staleness=1, mode="auto", stream=out)
    display.write(RECORD)
    display.write({**RECORD, "step": 5, "skipped": 1})
    display.close()
    lines = out.getvalue().splitlines()
    assert lines[0] == ("step 5/10 reward 0.500 loss 0.0100 stale(max) 1 hist [0:25% 1:75%] "
                        "gen 40% train 80% 900 tok/s ETA 1m15s")
    assert lines[1].endswith("SKIPPED(non-finite loss)")


def test_the_rich_panel_shows_the_staleness_histogram_and_the_reward_so_far():
    out = io.StringIO()
    display = ProgressDisplay(total_steps=10, policy="nemo_in_order", max_staleness=None, mode="rich", stream=out)
    display.write(RECORD)
    display.close()
    text = out.getvalue()
    assert "policy=nemo_in_order" in text and "η=∞" in text
    assert "5 / 10" in text and "0.500" in text and "█" in text and "900 tokens/s" in text
