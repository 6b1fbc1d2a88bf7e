"""Joining a running Ray cluster by address (docs/multi-node.md): the ray.init options verl passes are ones Ray accepts
when it connects, with the CPU default's logical resources as with the presets. The two-node run itself:
tests/e2e/test_two_nodes.py."""

from __future__ import annotations

import contextlib
import io

import pytest
import yaml

from verl_ext.main import LOCAL_CLUSTER_ONLY, joins_ray_cluster

ADDRESS = "192.0.2.9:6379"  # TEST-NET: never contacted, the address is only read


def _dry_run(*overrides: str, config_name: str = "toy_cpu") -> tuple[int, dict | None, str]:
    from verl_ext import dry_run

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = dry_run.main(["--config-name", config_name, *overrides])
    return rc, (yaml.safe_load(out.getvalue()) if rc == 0 else None), err.getvalue()


def _ray_init(doc: dict) -> dict:
    return doc["ray_kwargs"]["ray_init"]


@pytest.fixture(autouse=True)
def _no_ray_address(monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)


def _accepted_by_ray_when_joining(ray_init: dict) -> None:
    """What ray.init (ray 2.60) refuses when it connects to an existing cluster: none of it is set."""
    for key in LOCAL_CLUSTER_ONLY:
        assert not ray_init.get(key), (key, ray_init.get(key))


def test_cpu_default_joins_a_cluster_by_address_without_its_local_resources():
    rc, doc, err = _dry_run("trainer.nnodes=2", f"+ray_kwargs.ray_init.address={ADDRESS}")
    assert rc == 0, err[-3000:]
    ray_init = _ray_init(doc)
    _accepted_by_ray_when_joining(ray_init)
    assert ray_init["address"] == ADDRESS
    assert ray_init["runtime_env"]["env_vars"]["VERL_PLATFORM"] == "cpu"  # CPU mode still reaches every worker
    assert "joining the Ray cluster" in err and "ray_kwargs.ray_init.num_cpus=16" in err  # said, not silent


def test_ray_address_variable_joins_too(monkeypatch):
    monkeypatch.setenv("RAY_ADDRESS", ADDRESS)
    rc, doc, err = _dry_run()
    assert rc == 0, err[-3000:]
    _accepted_by_ray_when_joining(_ray_init(doc))


def test_without_an_address_or_with_local_the_cpu_default_sizes_its_own_cluster():
    for overrides in ([], ["+ray_kwargs.ray_init.address=local"]):
        rc, doc, err = _dry_run(*overrides)
        assert rc == 0, err[-3000:]
        ray_init = _ray_init(doc)
        assert ray_init["num_cpus"] == 16 and ray_init["num_gpus"] == 1, overrides
        assert ray_init["_system_config"] == {"prestart_worker_first_driver": False}
        assert "joining the Ray cluster" not in err


def test_resources_typed_with_an_address_are_refused_naming_both():
    rc, _, err = _dry_run(f"+ray_kwargs.ray_init.address={ADDRESS}", "ray_kwargs.ray_init.num_gpus=2")
    assert rc == 1
    assert f"ray_kwargs.ray_init.num_gpus=2 with ray_kwargs.ray_init.address={ADDRESS}" in err
    assert "ray start" in err


def test_paper_preset_joins_unchanged():
    rc, doc, err = _dry_run("trainer.nnodes=2", f"+ray_kwargs.ray_init.address={ADDRESS}",
                            "actor_rollout_ref.model.path=/shared/model", "data.train_files=/shared/train.parquet",
                            "data.val_files=/shared/val.parquet", config_name="edge_grpo_paper")
    assert rc == 0, err[-3000:]
    _accepted_by_ray_when_joining(_ray_init(doc))
    assert "joining the Ray cluster" not in err  # nothing to drop: the presets leave resources to the cluster


@pytest.mark.parametrize("address, joins", [(None, False), ("local", False), (ADDRESS, True), ("auto", True)])
def test_joins_ray_cluster_follows_rays_rule(address, joins, tmp_path, monkeypatch):
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path))  # no cluster recorded by a `ray start` on this machine
    assert joins_ray_cluster(address) is joins


def test_a_cluster_recorded_by_ray_start_is_joined_without_an_address(tmp_path, monkeypatch):
    """Ray's rule for ``address`` unset: the cluster the last ``ray start`` (or ``ray.cluster_utils.Cluster``) on this
    machine recorded in its temp folder."""
    from ray._common.utils import get_ray_address_file

    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path))
    record = get_ray_address_file(None)
    (tmp_path / "ray").mkdir(exist_ok=True)
    with open(record, "w") as f:
        f.write(ADDRESS)
    assert joins_ray_cluster(None)
    rc, doc, err = _dry_run()
    assert rc == 0, err[-3000:]
    _accepted_by_ray_when_joining(_ray_init(doc))
    assert "the cluster the last `ray start` on this machine recorded" in err
