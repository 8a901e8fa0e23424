"""Version-pinned LoRA generation (`engine.adapter_versions=K > 1`, engines/jax/adapter_versions.py):
a sample runs on the adapter version it was admitted on until it ends, the unmerged per-slot
adapters sample what a merged model samples, a push takes a free resident version or waits for
one, and the config refuses what it cannot do."""

import numpy as np
import pytest
from flax import nnx

from jaxrl_async.engines.base import GenerationRequest, SamplingParams
from jaxrl_async.engines.jax.config import EngineConfig
from tests.jaxrl_async.engines.jax.test_core import make_core, peaked_model, run
from tests.jaxrl_async.engines.jax.test_core_lora import merged_model, trained_adapter


@pytest.fixture(scope="module")
def model():
    return peaked_model()


def request(rid: str, prompt: list[int], new: int = 12, temperature: float = 0.0, n: int = 1) -> GenerationRequest:
    return GenerationRequest(rid, prompt, SamplingParams(new, temperature=temperature, seed=7, n=n))


def alone(model, req: GenerationRequest) -> dict:
    """The request's samples on a one-version engine of `model` (a merged model)."""
    core = make_core(model)
    core.submit(req)
    return run(core)


def step_collect(core, pieces: dict, steps: int | None = None) -> None:
    n = 0
    while core.has_work() and (steps is None or n < steps):
        for out in core.step():
            pieces.setdefault((out.request_id, out.sample_index), []).append(out)
        n += 1


def versions_of(pieces: dict) -> dict:
    """(request, sample) -> its tokens' version runs, joined."""
    out = {}
    for key, ps in pieces.items():
        runs: list[list[int]] = []
        for p in ps:
            for v, c in p.versions:
                if runs and runs[-1][0] == v:
                    runs[-1][1] += c
                else:
                    runs.append([v, c])
        out[key] = runs
    return out


def test_pinned_requests_sample_what_their_versions_merged_model_samples_in_one_batch(model):
    first, second = trained_adapter(model, 1), trained_adapter(model, 2)
    reqs = {"a": request("a", [1, 2, 3], n=2), "b": request("b", [9, 4]),
            "s": request("s", [5, 6, 7], temperature=0.9)}
    core = make_core(model, adapter_versions=3)
    core.update_weights(first, version=1)
    core.submit(reqs["a"])
    core.submit(reqs["s"])
    pieces: dict = {}
    step_collect(core, pieces, steps=3)  # a and s are mid-generation on version 1
    core.update_weights(second, version=2)
    assert core.version == 2 and not core.weights_pending  # an entry was free: no wait, no drain
    core.submit(reqs["b"])
    batched = []
    while core.has_work():
        for out in core.step():
            pieces.setdefault((out.request_id, out.sample_index), []).append(out)
        batched.append({seq.request_id for _, seq in core.slots.occupied()})
    assert any({"a", "b"} <= live for live in batched), "a (version 1) and b (version 2) never decoded together"
    got = {key: [t for p in ps for t in p.token_ids] for key, ps in pieces.items()}
    want = {**{k: v.token_ids for k, v in alone(merged_model(model, first), reqs["a"]).items()},
            **{k: v.token_ids for k, v in alone(merged_model(model, first), reqs["s"]).items()},
            **{k: v.token_ids for k, v in alone(merged_model(model, second), reqs["b"]).items()}}
    assert got == want
    # Non-trivial: the two versions sample differently.
    other = {k: v.token_ids for k, v in alone(merged_model(model, first), reqs["b"]).items()}
    assert other != {k: v for k, v in want.items() if k[0] == "b"}
    versions = versions_of(pieces)
    assert versions[("a", 0)] == [[1, 12]] and versions[("b", 0)] == [[2, 12]]


def test_after_pushes_every_sample_keeps_its_admission_version(model):
    adapters = [trained_adapter(model, s) for s in (1, 2, 3)]
    core = make_core(model, adapter_versions=3, num_slots=4)
    admitted: dict[str, int] = {}
    pieces: dict = {}
    for i in range(6):
        rid = f"r{i}"
        core.submit(request(rid, [1 + i, 2], new=6 + i, temperature=1.0))
        step_collect(core, pieces, steps=2)
        admitted[rid] = next(seq.pinned for _, seq in core.slots.occupied() if seq.request_id == rid)
        if i in (1, 3, 4):
            version = core.version + 1
            core.update_weights(adapters[version % 3], version=version)
    step_collect(core, pieces)
    versions = versions_of(pieces)
    assert set(versions) == {(rid, 0) for rid in admitted}
    for (rid, _), runs in versions.items():
        assert len(runs) == 1 and runs[0][0] == admitted[rid], (rid, runs)
    assert len({runs[0][0] for runs in versions.values()}) >= 3  # pushes mid-generation, new versions used


def test_a_push_that_finds_every_version_pinned_waits_for_a_slot_to_free(model):
    first, second = trained_adapter(model, 1), trained_adapter(model, 2)
    core = make_core(model, adapter_versions=2)
    pieces: dict = {}
    core.submit(request("a", [1, 2], new=4))  # version 0: the base (entry 0, the zero adapter)
    step_collect(core, pieces, steps=1)
    core.update_weights(first, version=1)  # the empty entry
    core.submit(request("b", [3, 4], new=20))
    step_collect(core, pieces, steps=1)
    core.update_weights(second, version=2)  # entries hold 0 (a) and 1 (b): it waits
    assert core.weights_pending and core.version == 1
    assert core.adapter_versions == {"versions": 2, "resident": [0, 1], "pushes_pinned": 1, "pushes_waited": 1}
    while not any(key[0] == "a" and p[-1].done for key, p in pieces.items()):
        assert core.weights_pending
        step_collect(core, pieces, steps=1)
    step_collect(core, pieces, steps=1)  # the first iteration after a's slot freed installs it
    assert not core.weights_pending and core.version == 2
    assert core.adapter_versions["resident"] == [1, 2] and core.adapter_versions["pushes_pinned"] == 2
    core.submit(request("c", [5], new=3))
    step_collect(core, pieces)
    versions = versions_of(pieces)
    assert versions == {("a", 0): [[0, 4]], ("b", 0): [[1, 20]], ("c", 0): [[2, 3]]}  # nothing lost
    assert all(p[-1].done for p in pieces.values())


def test_full_weights_with_several_versions_go_on_as_partial(model):
    """adapter_versions > 1 cannot act without adapters: a full push swaps at once, in-flight
    samples continue on it."""
    core = make_core(model, adapter_versions=3)
    pieces: dict = {}
    core.submit(request("a", [1, 2], new=6))
    step_collect(core, pieces, steps=2)
    core.update_weights(nnx.state(peaked_model(seed=1), nnx.Param), version=1)
    step_collect(core, pieces)
    assert versions_of(pieces)[("a", 0)] == [[0, 2], [1, 4]]
    assert core.adapter_versions["pushes_pinned"] == 0


def test_pinned_requests_do_not_migrate_and_finish_where_they_run(model):
    """Another replica need not hold a pinned version: a detach moves nothing (docs/lora.md)."""
    assert make_core(model).migratable
    core = make_core(model, adapter_versions=2)
    assert not core.migratable
    core.update_weights(trained_adapter(model, 1), version=1)
    core.submit(request("a", [1, 2], new=5))
    pieces: dict = {}
    step_collect(core, pieces, steps=2)
    assert core.detach("a") == (None, [])
    step_collect(core, pieces)
    assert versions_of(pieces) == {("a", 0): [[1, 5]]}


@pytest.mark.parametrize("overrides, message", [
    ({"adapter_versions": 0}, r"^engine.adapter_versions=0: must be an int >= 1"),
    ({"adapter_versions": -2}, r"^engine.adapter_versions=-2: must be an int >= 1"),
    ({"adapter_versions": 2, "sync_mode": "drain"}, r"^engine.adapter_versions=2: > 1 .* needs engine.sync_mode"),
    ({"adapter_versions": 2, "page_size": 16}, r"^engine.adapter_versions=2: > 1 .* needs engine.page_size=0"),
    ({"adapter_versions": 2, "speculation": {"when": "always"}},
     r"^engine.adapter_versions=2: > 1 .* needs engine.speculation.when=never"),
])
def test_bad_adapter_versions_are_one_line_errors_naming_the_key(overrides, message):
    from jaxrl_async.engines.speculation import SpeculationConfig

    if "speculation" in overrides:
        overrides = {**overrides, "speculation": SpeculationConfig(**overrides["speculation"])}
    with pytest.raises(ValueError, match=message) as info:
        EngineConfig(**overrides)
    assert "\n" not in str(info.value)


def test_the_unmerged_side_branch_is_the_merged_weight():
    """models/lora.py: x W + scale (x A[e]) B[e] per token equals x (W + scale A[e] B[e])."""
    import jax
    import jax.numpy as jnp

    from jaxrl_async.models.lora import adapter_output, merge_layers

    keys = jax.random.split(jax.random.key(0), 4)
    w = jax.random.normal(keys[0], (6, 3, 4))  # in 6, out [3, 4]
    a = jax.random.normal(keys[1], (3, 6, 2))  # K = 3 entries, rank 2
    b = jax.random.normal(keys[2], (3, 2, 3, 4))
    x = jax.random.normal(keys[3], (5, 6))
    entries = jnp.array([2, 0, 1, 2, 1])
    y = (x @ w.reshape(6, -1)).reshape(5, 3, 4) + adapter_output(x, {"a": a, "b": b}, jax.nn.one_hot(entries, 3), 0.5)
    for t, e in enumerate(np.asarray(entries)):
        merged = merge_layers({"w": w}, {"w": {"a": a[e], "b": b[e]}}, 0.5)["w"]
        np.testing.assert_allclose(y[t], (x[t] @ merged.reshape(6, -1)).reshape(3, 4), rtol=1e-5, atol=1e-5)
