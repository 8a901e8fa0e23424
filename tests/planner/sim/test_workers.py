"""The continuous-batching model against hand-computed times."""

from planner.sim.config import WorkerConfig
from planner.sim.group import SimGroup
from planner.sim.workers import Worker
from planner.types import GroupState


def worker(**kw):
    cfg = dict(num_workers=1, decode_alpha=1.0, decode_beta=0.5, prefill_per_token=0.0, t_sync=0.0)
    cfg.update(kw)
    return Worker(0, WorkerConfig(**cfg))


def group(uid, lengths, prompt=0, priority=0.0):
    g = SimGroup(uid, uid, prompt, list(lengths))
    g.priority, g.seq = priority, uid
    return g


def test_every_active_sequence_advances_one_token_per_decode_step():
    w = worker()
    w.enqueue(group(0, [2, 4]))
    assert [g.uid for g in w.start_queued(0.0)] == [0]
    # two active: a step costs 1 + 0.5*2 = 2 s; the short sequence ends after 2 steps
    assert w.next_completion() == 4.0
    assert w.complete(4.0) == []
    # one active: 1.5 s a step, 2 more steps
    assert w.next_completion() == 7.0
    (done,) = w.complete(7.0)
    assert done.uid == 0 and done.state == GroupState.DONE and done.versions == {0: 6}
    assert w.busy_time(10.0) == 7.0


def test_prefill_stalls_decoding_and_a_faster_worker_decodes_faster():
    w = worker(prefill_per_token=0.01, speeds=[2.0])
    w.enqueue(group(0, [3], prompt=100))
    w.start_queued(0.0)
    # prefill 100*0.01/2 = 0.5 s, then 3 steps of (1+0.5)/2 = 0.75 s
    assert abs(w.next_completion() - 2.75) < 1e-12


def test_the_queue_serves_lower_priority_first_and_respects_slots():
    w = worker(max_concurrency=2)
    w.enqueue(group(0, [5, 5], priority=2.0))
    w.enqueue(group(1, [5, 5], priority=1.0))
    w.enqueue(group(2, [5, 5], priority=1.0))
    assert [g.uid for g in w.start_queued(0.0)] == [1]  # priority 1 first; FIFO among equals
    t = w.next_completion()
    w.complete(t)
    assert [g.uid for g in w.start_queued(t)] == [2]


def test_a_weight_update_books_tokens_so_far_to_the_old_version():
    w = worker(decode_beta=0.0)
    g = group(0, [10])
    w.enqueue(g)
    w.start_queued(0.0)
    booked = w.apply_version(4.0, 1)
    assert booked == [(g, 0, 4)]
    w.complete(w.next_completion())
    assert g.versions == {0: 4, 1: 6} and g.last_versions == [1]


def test_killing_a_worker_keeps_each_trajectorys_progress_for_a_resume():
    w = worker(decode_beta=0.0, max_concurrency=2)
    running, queued_g = group(0, [3, 10]), group(1, [4])
    w.enqueue(running)
    w.enqueue(queued_g)
    w.start_queued(0.0)
    lost_running, lost_queued = w.kill(5.0)
    assert lost_running == [(running, 0, 3 + 5)] and lost_queued == [queued_g]
    assert running.done_tok == [3, 5] and not w.alive and w.active == 0
