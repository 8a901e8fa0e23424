"""The class vLLM mixes into its worker process: importable with torch alone, named by its import
path, and loading a pushed safetensors blob through `reload_weights`."""

import importlib
import subprocess
import sys

import pytest

from jaxrl_async.engines.vllm.engine import WORKER_EXTENSION
from jaxrl_async.engines.vllm.worker import WeightReceiver
from tests.helpers import REPO
from tests.helpers.fake_vllm import FakeWorker


def test_the_worker_extension_imports_neither_jax_nor_the_rest_of_jaxrl_async():
    probe = ("import sys, jaxrl_async.engines.vllm.worker\n"
             "print(*sorted(m for m in sys.modules if m.split('.')[0] in ('jax', 'flax', 'jaxrl_async', 'planner')))")
    out = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["jaxrl_async", "jaxrl_async.engines", "jaxrl_async.engines.vllm",
                                  "jaxrl_async.engines.vllm.worker"]


def test_the_engine_names_the_worker_extension_by_the_path_vllm_imports_it_from():
    module, _, name = WORKER_EXTENSION.rpartition(".")
    assert getattr(importlib.import_module(module), name) is WeightReceiver


def test_a_pushed_blob_is_loaded_through_reload_weights_and_its_tensor_count_returned():
    torch = pytest.importorskip("torch", reason="safetensors.torch needs torch (pip install -e '.[test]')")
    from safetensors.torch import save

    sent = {"a": torch.arange(4, dtype=torch.float32), "b": torch.ones(2, 2, dtype=torch.bfloat16)}
    worker = FakeWorker()
    assert worker.jaxrl_reload(save(sent)) == 2
    (loaded,) = worker.loaded
    assert loaded.keys() == sent.keys() and all(torch.equal(loaded[k], sent[k]) for k in sent)
