"""planner/configs.py: the one builder and check, and the simulator's conf/ files on top of them."""

from dataclasses import dataclass, field

import pytest

from planner.configs import MISSING, build, check, check_keys, defaults
from planner.sim.config import FaultSpec, SimConfig, WorkerConfig
from planner.sim.workloads import WORKLOADS
from planner.tools.simulate import register_config_nodes
from tests.helpers.conf_files import composed, extends, options, restated_defaults


@dataclass(frozen=True)
class Inner:
    rate: float = 0.5


@dataclass(frozen=True)
class Outer:
    size: int  # required
    inner: Inner = field(default_factory=Inner)
    spare: Inner | None = None
    tags: tuple[str, ...] = ("a",)


def test_the_builder_builds_nested_sections_from_mappings():
    assert build(Outer, {"size": 2, "inner": {"rate": 1.0}, "spare": {}}, "x") == Outer(2, Inner(1.0), Inner())
    assert build(Outer, {"size": 2, "inner": Inner(3.0)}, "x").inner == Inner(3.0)


def test_an_unknown_key_is_one_line_naming_the_dotted_key_and_the_known_ones():
    with pytest.raises(ValueError, match=r"^x\.inner\.rat: unknown key \(known: rate\)$"):
        build(Outer, {"size": 2, "inner": {"rat": 1.0}}, "x")
    with pytest.raises(ValueError, match=r"^sizes: unknown key for the top \(known: inner, size, spare, tags\)$"):
        build(Outer, {"sizes": 2}, "", what="key for the top")


def test_a_missing_required_key_and_hydras_missing_mark_are_the_same_one_line_error():
    for values in ({}, {"size": MISSING}):
        with pytest.raises(ValueError, match=r"^x\.size: required key missing \(set x\.size=\.\.\.\)$"):
            build(Outer, values, "x")


@pytest.mark.parametrize(("values", "message"), [
    ({"size": "abc"}, "x.size='abc': must be an integer"),
    ({"size": 2.5}, "x.size=2.5: must be an integer"),
    ({"size": True}, "x.size=True: must be an integer"),
    ({"size": 2, "inner": {"rate": "abc"}}, "x.inner.rate='abc': must be a number"),
    ({"size": 2, "spare": 3}, "x.spare=3: must be a mapping, or null"),
    ({"size": 2, "tags": "a"}, "x.tags='a': must be a list of strings"),
    ({"size": 2, "tags": ["a", 1]}, "x.tags=['a', 1]: must be a list of strings"),
])
def test_a_value_of_the_wrong_type_is_one_line_naming_the_dotted_key_before_post_init(values, message):
    with pytest.raises(ValueError) as info:
        build(Outer, values, "x")
    assert str(info.value) == message


def test_a_number_field_takes_an_integer_and_an_optional_field_takes_null():
    assert build(Outer, {"size": 2, "inner": {"rate": 1}, "spare": None, "tags": ("b",)}, "x") == \
        Outer(2, Inner(1), None, ("b",))


def test_text_in_a_simulator_number_field_names_the_key_not_the_class():
    with pytest.raises(ValueError, match=r"^sim\.trainer\.c0='abc': must be a number$"):
        build(SimConfig, {"trainer": {"c0": "abc"}}, "sim")
    with pytest.raises(ValueError, match=r"^sim\.workers\.speeds=\[1, 'x'\]: must be a list of numbers, or null$"):
        build(SimConfig, {"workers": {"num_workers": 2, "speeds": [1, "x"]}}, "sim")


def test_check_names_the_key_its_value_and_the_rule():
    check(True, "a.b", 1, "never shown")
    with pytest.raises(ValueError, match=r"^a\.b='z': must be one of \('x', 'y'\)$"):
        check(False, "a.b", "z", "must be one of ('x', 'y')")
    with pytest.raises(ValueError, match=r"^policy\.k: unknown parameter of policy 'p' \(known: none\)$"):
        check_keys({"k": 1}, (), "policy", what="parameter of policy 'p'")


def test_defaults_are_plain_data_with_the_missing_mark_for_required_fields():
    assert defaults(Outer) == {"size": MISSING, "inner": {"rate": 0.5}, "spare": None, "tags": ["a"]}
    assert defaults(SimConfig)["faults"]["events"] == [] and defaults(SimConfig)["workers"]["speeds"] is None


def test_the_simulators_old_sync_word_names_the_new_one():
    assert WorkerConfig().sync_mode == "partial"
    with pytest.raises(ValueError, match=r"^sim\.workers\.sync_mode='inflight' is now 'partial'$"):
        build(SimConfig, {"workers": {"sync_mode": "inflight"}}, "sim")


def test_a_fault_event_is_built_by_the_same_builder():
    with pytest.raises(ValueError, match=r"sim\.faults\.events\[0\]\.worker: required key missing"):
        build(SimConfig, {"faults": {"events": [{"time": 1.0}]}}, "sim")
    assert build(SimConfig, {"faults": {"events": [{"time": 1.0, "worker": 0}]}}, "sim").faults.events == (
        FaultSpec(1.0, 0),)


# ------------------------------------------------------------------ conf/sim and conf/workload
register_config_nodes()
TYPED = {"sim": {name: SimConfig for name in options("sim")},
         "workload": {name: w.Params for name, w in WORKLOADS.items()}}
OPTIONS = [(group, option) for group in TYPED for option in options(group)]
USER_INPUT = {("workload", "trace"): {"path": "trace.jsonl"}}  # keys a user must give


def test_conf_sim_default_is_exactly_the_dataclass_defaults():
    assert build(SimConfig, composed("sim", "default"), "sim") == SimConfig()
    assert build(SimConfig, composed("sim", "uneven"), "sim").workers == WorkerConfig(
        speeds=(1.5, 1.0, 1.0, 0.4), sync_mode="drain")


@pytest.mark.parametrize(("group", "option"), OPTIONS)
def test_a_simulator_group_file_states_only_what_differs_and_composes_every_key(group, option):
    cls = TYPED[group][option]
    assert restated_defaults(group, option, cls) == []
    values = composed(group, option)
    values.pop("name", None)
    assert set(values) == set(defaults(cls))
    if (group, option) not in USER_INPUT:  # (a trace is read when built: its file must exist)
        assert build(cls, values, group) is not None


@pytest.mark.parametrize(("group", "option"), OPTIONS)
def test_a_simulator_group_file_starts_from_its_defaults_node_or_from_a_sibling_that_does(group, option):
    """Its keys are the dataclass's, which `--help` describes (tests/jaxrl_async/cli/test_help.py)."""
    (first, *_) = extends(group, option)
    assert first.startswith(f"/base/{group}") or (
        first in options(group) and extends(group, first)[0].startswith(f"/base/{group}"))


@dataclass(frozen=True)
class RuledOptim:
    lr: float = 1e-3
    total: int = 10
    warmup: int = 0

    def __post_init__(self) -> None:
        check(self.lr > 0, "RuledOptim.lr", self.lr, "must be > 0")
        check(self.warmup <= self.total, "RuledOptim.warmup", self.warmup, "must be <= RuledOptim.total")


@dataclass(frozen=True)
class RuledTrainer:
    optim: RuledOptim = field(default_factory=RuledOptim)


def test_a_rule_broken_in_post_init_names_the_dotted_key_typed_not_the_class():
    with pytest.raises(ValueError) as info:
        build(RuledTrainer, {"optim": {"lr": -1.0}}, "trainer")
    assert str(info.value) == "trainer.optim.lr=-1.0: must be > 0"
    with pytest.raises(ValueError) as info:
        build(RuledOptim, {"warmup": 20}, "")
    assert str(info.value) == "warmup=20: must be <= total"  # the top level: bare keys
    with pytest.raises(ValueError, match=r"^RuledOptim.lr=-1: must be > 0$"):
        RuledOptim(lr=-1)  # built directly (library code), the class still names its field
