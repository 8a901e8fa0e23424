"""The reward worker's pipe protocol: ready (or start_error) once, then one answer per call."""

import multiprocessing

from jaxrl_async.reward_worker import serve


def _start(fn_path: str):
    ctx = multiprocessing.get_context("forkserver")
    parent, child = ctx.Pipe()
    process = ctx.Process(target=serve, args=(child, fn_path), daemon=True)
    process.start()
    child.close()
    return parent, process


def test_a_worker_says_ready_then_answers_each_call_with_its_value_or_its_exception_and_ends_at_eof():
    conn, process = _start("tests.helpers.reward_fns:raises_on_b")
    assert conn.recv() == ("ready", None)
    conn.send(("apple", "ab", "a"))
    assert conn.recv() == ("ok", 0.5)
    conn.send(("banana", "ab", "a"))
    assert conn.recv() == ("raised", ("ValueError", "cannot score 'banana'"))
    conn.close()
    process.join(10)
    assert process.exitcode == 0


def test_a_function_that_cannot_be_loaded_is_reported_once_and_the_worker_exits():
    conn, process = _start("tests.helpers.reward_fns:nope")
    kind, reason = conn.recv()
    assert kind == "start_error" and "has no attribute 'nope'" in reason
    process.join(10)
    assert process.exitcode == 0
