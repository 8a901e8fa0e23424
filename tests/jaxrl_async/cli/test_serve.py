"""`python -m jaxrl_async.serve`: starts, answers, stops on a signal with its counts; bad input is
one line and status 1."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from jaxrl_async.cli.serve import main
from tests.helpers import REPO

pytest.importorskip("fastapi", reason="the server needs the serve extra: pip install -e '.[serve]'")
pytest.importorskip("uvicorn", reason="the server needs the serve extra: pip install -e '.[serve]'")
import httpx  # noqa: E402

ENV = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(REPO)}


def test_the_command_serves_one_request_then_stops_on_sigterm_with_what_it_served():
    proc = subprocess.Popen([sys.executable, "-m", "jaxrl_async.serve", "port=0", "engine.max_len=64",
                             "engine.num_slots=2", "served_model_name=small"],
                            cwd=REPO, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        lines = []
        deadline = time.monotonic() + 120
        while not (lines and lines[-1].startswith("serving")):
            assert time.monotonic() < deadline and proc.poll() is None, "".join(lines)
            lines.append(proc.stderr.readline())
        url = lines[-1].split(" on ")[1].split()[0]
        assert lines[-1].startswith("serving 'small' on http://127.0.0.1:")
        reply = None
        while reply is None:  # the socket listens before the app runs: connections wait in its queue
            try:
                reply = httpx.post(url + "/inference/v1/generate", timeout=60,
                                   json={"model": "small", "token_ids": [1, 2, 3], "sampling_params": {"max_tokens": 4}})
            except httpx.TransportError:
                assert time.monotonic() < deadline
                time.sleep(0.1)
        assert reply.status_code == 200 and len(reply.json()["choices"][0]["token_ids"]) <= 4
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert json.loads(out) == {"submitted": 1, "finished": 1, "aborted": 0, "refused": 0, "failed": 0, "in_flight": 0}
    assert "Traceback" not in err


def test_bad_input_is_one_line_and_status_1(capsys):
    assert main(["port=70000"]) == 1
    assert capsys.readouterr().err == "error: port=70000: must be an int in [0, 65536)\n"
    assert main(["engine.num_slot=3"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "num_slot" in err and err.count("\n") == 1
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main([f"port={port}"]) == 1
        err = capsys.readouterr().err
    assert err.startswith(f"error: port={port}: cannot listen on 127.0.0.1:{port}") and err.count("\n") == 1


def test_a_missing_serve_extra_is_one_line_naming_the_install(capsys, monkeypatch):
    import importlib.util

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "uvicorn" else find_spec(name, *a))
    assert main(["port=0"]) == 1
    assert capsys.readouterr().err == ("error: serve: the 'uvicorn' package is not installed "
                                       "(pip install -e \".[serve]\")\n")


def test_keys_that_cannot_act_in_the_server_warn_one_line_each():
    from jaxrl_async.cli.serve import inert_keys, typed_config
    from jaxrl_async.engines.registry import entry_of

    config = typed_config({"model": {"source": "tiny"}, "engine": {"name": "jax", "replicas": 2,
                                                                    "speculation": {"when": "critical"}}})
    lines = inert_keys(entry_of(config.engine).facts(config.engine))
    assert [line.split(" has no effect")[0] for line in lines] == ["engine.replicas=2", "engine.speculation.when=critical"]


def test_help_lists_the_servers_keys():
    p = subprocess.run([sys.executable, "-m", "jaxrl_async.serve", "--help"], cwd=REPO, env=ENV,
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and "served_model_name" in p.stdout and "engine.max_len" in p.stdout
