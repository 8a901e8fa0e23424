"""`cluster=` modes state their facts (cluster/config.py), as engine backends do: what the run
reads of a mode comes from its entry, never from a field looked up by name."""

from __future__ import annotations

import pytest

from jaxrl_async.cluster.config import CLUSTER_MODES, ClusterConfig, ClusterFacts, ProcessConfig, cluster_config
from jaxrl_async.cluster.ray.config import RayClusterConfig


def test_each_mode_states_where_the_engine_runs_and_whether_it_can_migrate():
    local, slurm = cluster_config({"name": "local"}), cluster_config({"name": "slurm"})
    ray = cluster_config({"name": "ray", "num_workers": 3})
    assert local.facts == slurm.facts == ClusterFacts(engine_workers=None, workers_key=None, migrates=True)
    assert ray.facts == ClusterFacts(engine_workers=3, workers_key="num_workers", migrates=False)
    assert ray.mode == RayClusterConfig(num_workers=3) and ray.distributed == RayClusterConfig().distributed
    assert slurm.distributed.mode == "auto" and local.mode == ProcessConfig()


def test_every_mode_with_engine_workers_builds_their_engine_and_the_others_refuse_to():
    for name, mode in CLUSTER_MODES.items():
        workers = ClusterConfig(name, mode.config()).facts.engine_workers
        assert (workers is not None) == (mode.remote_engine is not None), name
    with pytest.raises(ValueError, match=r"^cluster.name='local': runs no engine workers"):
        ClusterConfig("local", ProcessConfig()).remote_engine("jax", {}, "tiny", None, lambda ids: None)


def test_a_mode_without_workers_joins_nothing_and_a_config_of_another_mode_is_refused():
    ClusterConfig("local", ProcessConfig()).connect()  # no cluster to reach, nothing imported
    with pytest.raises(ValueError, match=r"^cluster=ray config='ProcessConfig': must be a RayClusterConfig$"):
        ClusterConfig("ray", ProcessConfig())
    with pytest.raises(ValueError, match=r"^cluster.name='k8s': must be one of \('local', 'ray', 'slurm'\)"):
        cluster_config({"name": "k8s"})
