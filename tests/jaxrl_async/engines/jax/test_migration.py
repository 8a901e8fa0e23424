"""Migration between engine cores: a moved sample continues exactly as it would have unmoved."""

import pytest
from flax import nnx

from jaxrl_async.engines.base import GenerationRequest, SamplingParams, join_outputs
from jaxrl_async.engines.jax.config import EngineConfig
from jaxrl_async.engines.jax.core import EngineCore
from jaxrl_async.engines.jax.engine import make_core
from jaxrl_async.engines.migration import MovedRequest, MovedSample
from jaxrl_async.models.config import ModelConfig
from jaxrl_async.models.transformer import Transformer
from tests.helpers.engines import assert_same_samples, params_of

CFG = ModelConfig.tiny()
ENGINE = dict(num_slots=4, max_len=64, min_bucket=8, decode_steps_per_call=4)


@pytest.fixture(scope="module")
def models():
    return Transformer(CFG, rngs=nnx.Rngs(0)), Transformer(CFG, rngs=nnx.Rngs(1))


def core_of(model, **overrides) -> EngineCore:
    return make_core(model, CFG, EngineConfig(**{**ENGINE, **overrides}))


def requests() -> list[GenerationRequest]:
    """A sampled group (temperature 1, top-p) and a greedy one, both long enough to move mid-way."""
    return [GenerationRequest("long", [3, 1, 4, 1, 5], SamplingParams(30, temperature=1.0, top_p=0.9, n=2, seed=7)),
            GenerationRequest("other", [2, 7], SamplingParams(20, temperature=0.0))]


class Pieces:
    """Every piece streamed by any core, per sample, in arrival order."""

    def __init__(self):
        self.by_sample: dict = {}

    def add(self, outputs) -> None:
        for out in outputs:
            self.by_sample.setdefault((out.request_id, out.sample_index), []).append(out)

    def run(self, core: EngineCore, steps: int | None = None) -> None:
        n = 0
        while core.has_work() and (steps is None or n < steps):
            self.add(core.step())
            n += 1

    def joined(self) -> dict:
        for key, pieces in self.by_sample.items():
            assert sum(p.done for p in pieces) == 1 and pieces[-1].done, key  # one done piece, last
        return {key: join_outputs(p) for key, p in self.by_sample.items()}


def unmoved(model, reqs) -> dict:
    core, pieces = core_of(model), Pieces()
    for r in reqs:
        core.submit(r)
    pieces.run(core)
    return pieces.joined()


def test_a_migrated_sample_draws_exactly_the_tokens_and_logprobs_it_would_have_drawn_unmoved(models):
    want = unmoved(models[0], requests())
    source, target, pieces = core_of(models[0]), core_of(models[0]), Pieces()
    for r in requests():
        source.submit(r)
    target.submit(GenerationRequest("busy", [9], SamplingParams(40, seed=3)))  # the target is not idle
    pieces.run(source, steps=2)
    moved, flushed = source.detach("long")
    pieces.add(flushed)
    assert [s.sample_index for s in moved.samples] == [0, 1]
    assert all(0 < s.next_token_index < 30 for s in moved.samples)  # moved mid-way: non-trivial
    assert source.detach("long") == (None, [])  # the source forgot it
    target.attach(moved)
    pieces.run(target)
    pieces.run(source)
    got = pieces.joined()
    del got[("busy", 0)]
    assert_same_samples(got, want)
    assert source.counters["migrated_out"] == 2 and target.counters["migrated_in"] == 2


def test_a_queued_request_moves_with_all_its_samples_fresh(models):
    want = unmoved(models[0], requests()[:1])
    source, target, pieces = core_of(models[0], num_slots=2), core_of(models[0]), Pieces()
    source.submit(GenerationRequest("first", [5], SamplingParams(12, seed=1, n=2)))
    source.submit(requests()[0])
    pieces.run(source, steps=1)  # "long" waits behind "first"
    moved, flushed = source.detach("long")
    assert flushed == [] and [s.token_ids for s in moved.samples] == [(), ()]
    target.attach(moved)
    pieces.run(target)
    got = pieces.joined()
    assert_same_samples({k: v for k, v in got.items() if k[0] == "long"}, want)


def test_migration_across_a_weight_swap_keeps_the_prefix_versions_and_tags_new_tokens_with_the_target(models):
    source, target, pieces = core_of(models[0]), core_of(models[0]), Pieces()
    target.update_weights(params_of(models[1]), version=1)
    source.submit(requests()[0])
    pieces.run(source, steps=2)
    moved, flushed = source.detach("long")
    pieces.add(flushed)
    target.attach(moved)
    pieces.run(target)
    got = pieces.joined()
    want = unmoved(models[0], requests()[:1])
    for s in moved.samples:
        key, g = ("long", s.sample_index), s.next_token_index
        sample = got[key]
        assert sample.token_ids[:g] == want[key].token_ids[:g]  # the prefix is the source's
        assert sample.versions == [[0, g], [1, len(sample.token_ids) - g]]
        assert len(sample.token_ids) > g


def test_an_abort_after_a_migration_ends_each_moved_sample_once_waiting_or_decoding(models):
    source, target, pieces = core_of(models[0]), core_of(models[0], num_slots=2), Pieces()
    target.submit(GenerationRequest("busy", [9], SamplingParams(40, seed=3, n=2)))
    pieces.run(target, steps=1)  # the target's slots are full: the moved samples wait
    for r in requests():
        source.submit(r)
    pieces.run(source, steps=1)
    moved, flushed = source.detach("long")
    pieces.add(flushed)
    target.attach(moved)
    assert source.abort("long") == []  # the source no longer holds it
    pieces.add(target.abort("long"))  # still waiting for a slot
    assert target.abort("long") == []
    pieces.run(target)
    pieces.run(source)
    got = pieces.joined()
    assert [got[("long", i)].finish_reason for i in (0, 1)] == ["abort", "abort"]
    assert all(len(got[("long", i)].token_ids) == moved.samples[i].next_token_index for i in (0, 1))

    source, target, pieces = core_of(models[0]), core_of(models[0]), Pieces()
    source.submit(requests()[0])
    pieces.run(source, steps=1)
    moved, flushed = source.detach("long")
    pieces.add(flushed)
    target.attach(moved)
    pieces.run(target, steps=1)  # decoding on the target now
    pieces.add(target.abort("long"))
    pieces.run(target)
    got = pieces.joined()
    assert [got[("long", i)].finish_reason for i in (0, 1)] == ["abort", "abort"]
    assert all(len(got[("long", i)].token_ids) > moved.samples[i].next_token_index for i in (0, 1))


def test_a_paged_or_drain_core_declines_to_migrate(models):
    for overrides in (dict(page_size=8), dict(sync_mode="drain")):
        core = core_of(models[0], **overrides)
        core.submit(requests()[0])
        core.step()
        assert not core.migratable and core.detach("long") == (None, [])
        with pytest.raises(ValueError, match="cannot take migrated samples"):
            core.attach(MovedRequest(requests()[1], (MovedSample(0, ()),)))


def test_a_greedy_sample_moved_between_speculating_cores_yields_plain_decodings_tokens(models):
    # Greedy speculation equals plain decoding token for token, so a move between two n-gram
    # speculating cores must too: the target's n-gram draft reads the moved sample's prompt and
    # prefix (a wrong context only changes drafts, a wrong prefix changes tokens).
    from jaxrl_async.engines.speculation import SpeculationConfig

    looping = [GenerationRequest("loop", [3, 1, 4, 3, 1, 4, 3, 1], SamplingParams(30, temperature=0.0))]
    want = unmoved(models[0], looping)
    spec = {"speculation": SpeculationConfig(when="always", tokens=3)}
    source, target, pieces = core_of(models[0], **spec), core_of(models[0], **spec), Pieces()
    source.submit(looping[0])
    pieces.run(source, steps=2)
    moved, flushed = source.detach("loop")
    pieces.add(flushed)
    assert 0 < moved.samples[0].next_token_index < 30  # moved mid-way: non-trivial
    target.attach(moved)
    pieces.run(target)
    assert_same_samples(pieces.joined(), want)
    assert target.counters["drafted"] > 0  # the target really speculated the moved sample
