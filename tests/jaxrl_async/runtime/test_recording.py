"""The run's record (runtime/recording.py): the engine's iterations counted into the run's totals,
and the tail's counts as summary.json and the step records give them (runtime/metrics.py)."""

from jaxrl_async.engines.base import EngineTiming
from jaxrl_async.runtime.metrics import RunStats, tail_counts
from jaxrl_async.runtime.recording import RunRecorder
from jaxrl_async.runtime.tracing import RunTracer


class NoLedger:
    def flush(self, *, sync: bool = False) -> None:
        pass


def test_the_engines_decode_iterations_are_summed_into_the_tail_counts_and_loads_are_not():
    stats = RunStats()
    recorder = RunRecorder(NoLedger(), RunTracer(None, lambda: 0.0), [], total_steps=1, run_meta={})
    recorder.engine_work(stats, [EngineTiming("decode", 0, 0.0, 0.1, 4, 8, drafted=12, accepted=5, speculating=3),
                                 EngineTiming("load", 0, 0.1, 0.2, version=1),
                                 EngineTiming("decode", 1, 0.2, 0.1, 4, 8)], run_s=lambda t: t)
    # Counted before a step's record (traced with the next drain), then at the step's end.
    recorder.count(stats, [EngineTiming("decode", 0, 0.3, 0.1, 2, 4, drafted=8, accepted=7, speculating=2)])
    recorder.engine_work(stats, [], run_s=lambda t: t)
    assert stats.engine_iterations == 3
    assert tail_counts(stats) == {"groups_migrated": 0, "speculation_drafted_tokens": 20,
                                  "speculation_accepted_tokens": 12, "speculation_acceptance": 0.6,
                                  "speculating_sequences": 5}


def test_an_engine_that_times_no_iteration_has_unknown_speculation_counts_not_zero():
    counts = tail_counts(RunStats(groups_migrated=2))
    assert counts == {"groups_migrated": 2, "speculation_drafted_tokens": None, "speculation_accepted_tokens": None,
                      "speculation_acceptance": None, "speculating_sequences": None}
    # Iterations without a draft: speculation counted, nothing drafted, no acceptance rate.
    assert tail_counts(RunStats(engine_iterations=4))["speculation_acceptance"] is None
