"""Placement from config: which devices the trainer's mesh and each engine replica get."""

from __future__ import annotations

from dataclasses import dataclass

import jax
import pytest

from jaxrl_async.cluster.placement import plan_placement
from jaxrl_async.trainer.config import MeshConfig, TrainerConfig
from planner.configs import build


@dataclass(frozen=True)
class FakeDevice:
    """A device of a job that this test process does not have (two hosts of four)."""

    id: int
    process_index: int


def devices(hosts: int, per_host: int) -> list[FakeDevice]:
    return [FakeDevice(h * per_host + i, h) for h in range(hosts) for i in range(per_host)]


def test_the_default_is_one_unsharded_trainer_device_and_the_engine_on_it():
    p = plan_placement(MeshConfig())
    assert p.trainer_mesh is None and p.engine_meshes == (None,)
    assert p.summary() == {"processes": 1, "trainer": {"devices": 1, "mesh": {"data": 1, "fsdp": 1, "tensor": 1}},
                           "engine": {"devices": 1, "replicas": 1, "tensor_parallel": 1, "colocate": True}}


def test_fsdp_by_tensor_trainer_and_two_colocated_replicas_share_the_first_devices():
    p = plan_placement(MeshConfig(fsdp=2, tensor=2), replicas=2, tensor_parallel=1)
    local = jax.devices()
    assert dict(p.trainer_mesh.shape) == {"data": 1, "fsdp": 2, "tensor": 2}
    assert list(p.trainer_mesh.devices.flat) == local[:4]
    assert [list(m.devices.flat) for m in p.engine_meshes] == [[local[0]], [local[1]]]
    assert p.summary()["engine"] == {"devices": 2, "replicas": 2, "tensor_parallel": 1, "colocate": True}


def test_a_lone_engine_beside_a_sharded_trainer_gets_a_mesh_so_the_push_stays_on_device():
    (mesh,) = plan_placement(MeshConfig(fsdp=2)).engine_meshes
    assert mesh is not None and list(mesh.devices.flat) == [jax.devices()[0]]


def test_separate_engines_take_the_devices_the_trainer_leaves():
    p = plan_placement(MeshConfig(fsdp=2), replicas=1, tensor_parallel=2, colocate=False)
    local = jax.devices()
    assert list(p.trainer_mesh.devices.flat) == local[:2]
    (mesh,) = p.engine_meshes
    assert list(mesh.devices.flat) == local[2:4] and dict(mesh.shape) == {"data": 1, "fsdp": 1, "tensor": 2}
    # one separate device is still a mesh: the engine must not land on the trainer's device
    (single,) = plan_placement(MeshConfig(), colocate=False).engine_meshes
    assert list(single.devices.flat) == [local[1]]


def test_a_mesh_over_two_hosts_spans_processes_and_engines_stay_on_process_0():
    job = devices(hosts=2, per_host=4)
    p = plan_placement(MeshConfig(data=2, fsdp=4), replicas=4, devices=job, processes=2)
    assert p.trainer_devices == tuple(job)
    assert [m.devices.flat[0].process_index for m in p.engine_meshes] == [0, 0, 0, 0]
    with pytest.raises(ValueError, match=r"engine.replicas=5 x engine.tensor_parallel=1 needs 5 devices; "
                                         r"the trainer's 4 device\(s\) on process 0"):
        plan_placement(MeshConfig(data=2, fsdp=4), replicas=5, devices=job, processes=2)


def test_a_trainer_mesh_that_leaves_a_process_without_a_shard_is_refused():
    with pytest.raises(ValueError, match=r"covers the devices of 1 of the job's 2 processes; make it span all 8"):
        plan_placement(MeshConfig(fsdp=4), devices=devices(hosts=2, per_host=4), processes=2)


def test_too_few_devices_is_one_line_naming_the_keys():
    with pytest.raises(ValueError, match=r"trainer.mesh: data=2 fsdp=2 tensor=2 needs 8 devices; this job has 4"):
        plan_placement(MeshConfig(data=2, fsdp=2, tensor=2))
    with pytest.raises(ValueError, match=r"needs 2 devices; the 0 device\(s\) of process 0 the trainer does not use"):
        plan_placement(MeshConfig(fsdp=4), tensor_parallel=2, colocate=False)


def test_mesh_keys_are_typed_and_checked():
    assert build(TrainerConfig, {"mesh": {"fsdp": 2}}, "trainer").mesh == MeshConfig(fsdp=2)
    with pytest.raises(ValueError, match=r"trainer.mesh.tensor=0: must be an int >= 1"):
        build(TrainerConfig, {"mesh": {"tensor": 0}}, "trainer")
    with pytest.raises(ValueError, match=r"trainer.mesh.model: unknown key"):
        build(TrainerConfig, {"mesh": {"model": 2}}, "trainer")


def test_too_few_cpu_devices_names_the_recipe_that_places_them():
    replicas = len(jax.devices()) - 1  # the recipe's count: the trainer's device and one per replica
    with pytest.raises(ValueError) as refused:
        plan_placement(MeshConfig(), replicas=replicas)
    assert str(refused.value).endswith(
        f"on CPU set XLA_FLAGS=--xla_force_host_platform_device_count={replicas + 1} and engine.colocate=false")
    # The recipe (this process has that many host devices): every replica on a device of its own.
    p = plan_placement(MeshConfig(), replicas=replicas, colocate=False)
    assert [list(m.devices.flat) for m in p.engine_meshes] == [[d] for d in jax.devices()[1:]]
    with pytest.raises(ValueError, match=r"this job has \d+ \(1 process\(es\)\); on CPU set "
                                         r"XLA_FLAGS=--xla_force_host_platform_device_count=64$"):
        plan_placement(MeshConfig(fsdp=64))
