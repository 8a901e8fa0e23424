"""The progress display: plain lines off a terminal, a rich panel on one."""

import io

from jaxrl_async.runtime.progress import STARTING, Eta, ProgressDisplay

RECORD = {"step": 4, "reward_mean": 0.5, "loss": 0.01, "max_staleness_in_batch": 1, "tokens_per_s": 900.0,
          "staleness_hist": {"0": 10, "1": 30}, "generator_busy": 0.4, "trainer_busy": 0.8, "eta_s": 75.0,
          "elapsed_s": 20.0, "skipped": 0}


def test_off_a_terminal_each_step_is_one_plain_line_with_reward_staleness_busy_and_eta():
    out = io.StringIO()
    display = ProgressDisplay(total_steps=10, policy="lookahead", max_staleness=1, mode="auto", stream=out)
    display.write(RECORD)
    display.write({**RECORD, "step": 5, "skipped": 1})
    display.close()
    lines = out.getvalue().splitlines()[1:]
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


def test_plain_progress_says_it_compiles_before_the_first_step_and_the_first_eta_is_unknown():
    out = io.StringIO()
    display = ProgressDisplay(total_steps=10, policy="lookahead", max_staleness=1, mode="plain", stream=out)
    assert out.getvalue() == STARTING + "\n" and "compiling" in STARTING  # printed at once, not at step 1
    display.write({**RECORD, "step": 0, "eta_s": None})
    assert out.getvalue().splitlines()[1].endswith("ETA –")


def test_the_eta_leaves_the_first_steps_compile_out():
    eta = Eta(total_steps=100)
    assert eta.step_done(1, now=30.0) is None  # 30 s of compile and one step: no rate yet
    assert eta.step_done(2, now=31.0) == 98 * 1.0
    assert eta.step_done(5, now=34.0) == 95 * 1.0  # 4 steps in 4 s since the first: 1 s a step
    assert eta.step_done(100, now=129.0) == 0.0


def test_a_resumed_segment_measures_its_eta_from_its_own_first_step():
    eta = Eta(total_steps=100)
    assert eta.step_done(51, now=1000.0) is None
    assert eta.step_done(53, now=1004.0) == 47 * 2.0


def test_the_held_out_pass_rate_shows_in_the_plain_line_and_stays_in_the_panel():
    out = io.StringIO()
    display = ProgressDisplay(total_steps=10, policy="lookahead", max_staleness=1, mode="plain", stream=out)
    display.write({**RECORD, "eval/pass_at_1": 0.25, "eval/version": 0})
    display.write(RECORD)
    lines = out.getvalue().splitlines()
    assert "eval(v0) pass@1 0.250" in lines[1] and "eval" not in lines[2]  # once, with the record that has it

    out = io.StringIO()
    display = ProgressDisplay(total_steps=10, policy="lookahead", max_staleness=1, mode="rich", stream=out)
    display.write({**RECORD, "eval/pass_at_1": 0.25, "eval/version": 0})
    display.write({**RECORD, "step": 6, "eval/pass_at_1": 0.75, "eval/version": 6})
    display.write({**RECORD, "step": 7})
    panel = display._panel({**RECORD, "step": 7})
    display.close()
    from rich.console import Console

    console = Console(file=io.StringIO(), width=120)
    console.print(panel)
    text = console.file.getvalue()
    assert "eval pass@1" in text and "0.750 (weights v6; first: 0.250 at v0)" in text


TAIL = {"speculation_drafted_tokens": 120, "speculation_accepted_tokens": 80, "speculating_sequences": 40,
        "groups_migrated": 3}


def test_the_plain_line_shows_the_tail_counts_of_the_features_that_are_on_even_when_zero():
    out = io.StringIO()
    display = ProgressDisplay(total_steps=10, policy="lookahead", max_staleness=1, mode="plain", stream=out,
                              speculation=True, migration=True)
    display.write({**RECORD, **TAIL})
    display.write({**RECORD, **TAIL, "speculation_drafted_tokens": 0, "speculation_accepted_tokens": 0,
                   "groups_migrated": 0})
    first, zero = out.getvalue().splitlines()[1:]
    assert first.endswith(" tail: drafted 120 tokens in 40 sequence-iterations, accepted 80 (67%); migrated 3 groups")
    assert zero.endswith(" tail: drafted 0 tokens in 40 sequence-iterations, accepted 0; migrated 0 groups")


def test_with_the_tail_features_off_the_line_says_nothing_of_them():
    out = io.StringIO()
    ProgressDisplay(total_steps=10, policy="lookahead", max_staleness=1, mode="plain", stream=out).write(
        {**RECORD, **TAIL})
    assert "tail" not in out.getvalue() and "drafted" not in out.getvalue()


def test_an_engine_that_times_no_iteration_shows_its_speculation_as_not_counted():
    out = io.StringIO()
    display = ProgressDisplay(total_steps=10, policy="lookahead", max_staleness=1, mode="rich", stream=out,
                              speculation=True)
    display.write({**RECORD, **TAIL, "speculation_drafted_tokens": None})
    display.close()
    assert "speculation not counted" in out.getvalue()
