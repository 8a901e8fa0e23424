"""The simulator's tail: critical marks speculate (when=critical), migrations move running groups
to a less loaded worker with their prefix, and the audit passes every such run."""

from __future__ import annotations

import json

import pytest

from planner.configs import build
from planner.ledger import LedgerWriter
from planner.policies.lookahead import Lookahead, LookaheadParams
from planner.registry import make_policy
from planner.sim import SimConfig, Simulator, make_workload
from planner.ledger_audit import audit
from planner.types import PlanContext

CTX = PlanContext(batch_groups=8, group_size=4, max_staleness=1, total_steps=20)


def simulate(tmp_path, sim: dict, migrate: bool = False, policy=None, name="run"):
    run_dir = tmp_path / name
    run_dir.mkdir()
    policy = policy if policy is not None else Lookahead(CTX, LookaheadParams(migrate=migrate))
    with LedgerWriter(run_dir / "ledger.jsonl") as ledger:
        result = Simulator(policy, CTX, make_workload({"name": "heavy_tail"}, CTX.group_size),
                           build(SimConfig, sim, "sim"), seed=3, ledger=ledger).run()
    return result, run_dir


class Tail:
    """Forwards to a policy and counts its tail decisions; with `strip`, removes them (what a
    policy without the rule decides)."""

    def __init__(self, policy, strip: bool):
        self._p, self._strip, self.named = policy, strip, 0

    def __getattr__(self, name):
        attr = getattr(self._p, name)
        if not callable(attr) or name.startswith("_") or name in ("state_dict", "staleness_bound"):
            return attr

        def call(**kw):
            d = attr(**kw)
            if hasattr(d, "critical"):
                self.named += len(d.critical) + len(d.migrate)
                if self._strip:
                    d.critical, d.migrate = [], []
            return d
        return call


def test_critical_marks_change_nothing_when_no_worker_speculates(tmp_path):
    marking = Tail(Lookahead(CTX), strip=False)
    _, with_marks = simulate(tmp_path, {}, policy=marking, name="marks")
    assert marking.named > 0
    _, without = simulate(tmp_path, {}, policy=Tail(Lookahead(CTX), strip=True), name="plain")
    assert (with_marks / "ledger.jsonl").read_bytes() == (without / "ledger.jsonl").read_bytes()


def test_speculating_the_critical_groups_is_faster_and_keeps_the_bound(tmp_path):
    plain, _ = simulate(tmp_path, {}, name="plain")
    fast, run_dir = simulate(tmp_path, {"workers": {"speculation": {"when": "critical", "acceptance": 0.7}}})
    assert fast.summary["speculation"]["groups_marked"] > 0
    assert fast.summary["elapsed_s"] < 0.9 * plain.summary["elapsed_s"]
    report = audit(run_dir, 1)
    assert report.ok, report.verdict()
    assert report.groups_dropped == 0 and report.max_token_staleness <= 1 and report.length_bias["ks"] == 0
    assert "speculation" not in plain.summary and "groups_migrated" not in plain.summary  # defaults: summaries as before


def test_any_policy_can_use_the_speculative_engine_always(tmp_path):
    plain, _ = simulate(tmp_path, {}, policy=make_policy("nemo_in_order", CTX), name="plain")
    fast, run_dir = simulate(tmp_path, {"workers": {"speculation": {"when": "always"}}},
                             policy=make_policy("nemo_in_order", CTX))
    assert fast.summary["elapsed_s"] < 0.9 * plain.summary["elapsed_s"]
    assert audit(run_dir, 1).ok


def test_migrations_move_running_groups_with_their_prefix_and_the_audit_passes(tmp_path):
    # Uneven workers: a straggler on the slow worker moves to a faster, less loaded one.
    sim = {"workers": {"num_workers": 3, "speeds": [0.25, 1.0, 1.0]}}
    result, run_dir = simulate(tmp_path, sim, migrate=True)
    lines = [json.loads(x) for x in (run_dir / "ledger.jsonl").read_text().splitlines()]
    moved = [e for e in lines if e["event"] == "migrate"]
    assert moved and result.summary["groups_migrated"] == len(moved)
    assert any(e["versions"] for e in moved), "some migrated group must carry a generated prefix"
    assert all(e["from"] != e["to"] for e in moved)
    report = audit(run_dir, 1)
    assert report.ok, report.verdict()
    assert report.migrations == len(moved) and report.groups_dropped == 0 and report.max_token_staleness <= 1
    # No ping-pong: a group moves at most once per attempt (no faults here: one attempt each).
    uids = [e["uid"] for e in moved]
    assert len(uids) == len(set(uids))


def test_a_migration_needs_a_strictly_less_loaded_worker(tmp_path):
    result, run_dir = simulate(tmp_path, {"workers": {"num_workers": 1}}, migrate=True)
    assert "groups_migrated" not in result.summary
    assert audit(run_dir, 1).ok


def test_a_migration_target_is_strictly_less_loaded_holds_the_weights_and_has_room():
    from planner.sim.group import SimGroup
    sim = Simulator(Lookahead(CTX), CTX, make_workload({"name": "heavy_tail"}, CTX.group_size),
                    build(SimConfig, {"workers": {"num_workers": 3, "max_concurrency": 8}}, "sim"), seed=0)
    src, a, b = sim.workers
    g = SimGroup(99, 0, 10, [50, 50])
    g.remaining = 2
    src.active, a.active, b.active = 6, 1, 3
    src.version, a.version, b.version = 2, 2, 2
    assert sim.tail.target(src, g) is a  # the least loaded other worker
    a.version = 1  # older weights than the group's tokens on src: its new tokens would be staler
    assert sim.tail.target(src, g) is b
    b.active = 4  # 4 + 2 = 6 is not strictly less than the source's 6
    assert sim.tail.target(src, g) is None
    b.active, b.max_seqs = 1, 2  # no room for the group's 2 sequences beside 1 active
    assert sim.tail.target(src, g) is None


def test_a_mark_for_a_group_that_finished_at_the_same_instant_is_let_go():
    # One completion can end several groups; the policy hears of them one by one, so a mark sent
    # with the first one's finish may name another that this completion already ended.
    from planner.sim.group import SimGroup
    from planner.types import Decision, GroupState
    sim = Simulator(Lookahead(CTX), CTX, make_workload({"name": "heavy_tail"}, CTX.group_size), SimConfig(), seed=0)
    g = SimGroup(7, 0, 10, [5])
    g.state = GroupState.DONE
    sim.groups[7] = g
    sim._apply(Decision(critical=[7], migrate=[7]), "on_group_finished")  # nothing to speed up: no error
    g.state = GroupState.TRAINED
    with pytest.raises(ValueError, match="uid 7 in critical"):
        sim._apply(Decision(critical=[7]), "on_group_finished")  # any other state is still a policy bug
