"""Freed heap memory goes back to the OS (`host_memory.trim`), a train step gives it back, and a
checkpoint save buffers a bounded part of the state (`checkpoint.SAVE_CONCURRENT_GB`): the three
fixes that bring SmolLM2-135M's full fine-tune under TRL's peak memory (docs/memory.md). Each
measurement runs in a fresh process, so that neither this process's heap nor its other tests'
arrays blur it."""

import platform
import subprocess
import sys
import textwrap

import pytest

from jaxrl_async import host_memory

glibc = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="malloc_trim is glibc's")

RSS = """
def rss_mib():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
"""


def run(code: str) -> list[float]:
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(RSS) + textwrap.dedent(code)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return [float(x) for x in done.stdout.split()]


@glibc
def test_trim_gives_the_free_pages_of_the_heap_back():
    """512 blocks of 1 MiB from the heap (under a raised mmap threshold, as glibc raises it itself
    after freeing large blocks), all freed but the last, which pins the heap's top: glibc keeps
    the freed 511 MiB resident until `trim`."""
    before, after_free, after_trim = run("""
        import ctypes
        from jaxrl_async import host_memory
        libc = ctypes.CDLL(None)
        libc.malloc.restype = ctypes.c_void_p
        libc.mallopt(-3, 64 << 20)  # M_MMAP_THRESHOLD: 1 MiB blocks come from the heap
        libc.mallopt(-1, 1 << 30)   # M_TRIM_THRESHOLD: free() itself trims nothing
        blocks = [libc.malloc(1 << 20) for _ in range(512)]
        for b in blocks:
            ctypes.memset(b, 1, 1 << 20)
        before = rss_mib()
        for b in blocks[:-1]:
            libc.free(ctypes.c_void_p(b))
        after_free = rss_mib()
        assert host_memory.trim()
        print(before, after_free, rss_mib())
    """)
    assert before - after_free < 64, (before, after_free)  # non-trivial: free() alone kept the pages
    assert after_free - after_trim > 400, (after_free, after_trim)


def test_trim_is_a_no_op_where_malloc_trim_is_missing(monkeypatch):
    monkeypatch.setattr(host_memory, "_malloc_trim", lambda: None)
    assert host_memory.trim() is False


def test_a_train_step_gives_freed_heap_memory_back(monkeypatch):
    from tests.jaxrl_async.trainer.test_trainer import make_batch, make_trainer

    calls = []
    monkeypatch.setattr(host_memory, "trim", lambda: calls.append(1) or True)
    trainer = make_trainer()
    trainer.step(make_batch(0))
    trainer.step(make_batch(1))
    assert calls == [1, 1]


def test_a_checkpoint_save_buffers_a_bounded_part_of_the_state():
    """0.75 GiB of random float32 (incompressible): with orbax's default the save encodes all of it
    into chunk buffers before they reach the disk (+0.7 GiB); bounded, +0.3 GiB or less."""
    rise_gib = run("""
        import tempfile, threading, time
        import jax, jax.numpy as jnp
        from jaxrl_async.checkpoint import Checkpointer
        state = {"params": {f"w{i}": jax.random.normal(jax.random.key(i), (24, 1024, 1024)) for i in range(8)},
                 "version": 1}
        jax.block_until_ready(state)
        peak, base, done = [0.0], rss_mib(), threading.Event()
        def watch():
            while not done.is_set():
                peak[0] = max(peak[0], rss_mib())
                time.sleep(0.01)
        threading.Thread(target=watch, daemon=True).start()
        with tempfile.TemporaryDirectory() as d:
            checkpointer = Checkpointer(d, keep=1)
            checkpointer.save(1, state, {"step": 1})
            checkpointer.wait_written()
            checkpointer.close()
        done.set()
        print((peak[0] - base) / 1024)
    """)[0]
    assert rise_gib < 0.45, rise_gib
