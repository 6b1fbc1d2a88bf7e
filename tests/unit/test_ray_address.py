"""Joining a running Ray cluster by address (docs/multi-node.md): the ray.init options verl passes are ones Ray accepts
when it connects, with the CPU default's logical resources as with the presets. The two-node run itself:
tests/e2e/test_two_nodes.py."""

from __future__ import annotations

import contextlib
import io

import pytest
import yaml

from verl_ext.config import ConfigError
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


def test_without_an_address_or_with_local_the_cpu_default_sizes_its_own_cluster(ray_tmp):
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


@pytest.fixture
def ray_tmp(tmp_path, monkeypatch):
    """Ray's lookup of a running cluster, cut off from whatever else runs on this machine: its default temp folder
    (where ``ray start`` records the cluster) is an empty one of this test's, and no Ray process (GCS) is running."""
    import ray._private.services as services

    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path))
    monkeypatch.setattr(services, "find_gcs_addresses", lambda: [])
    return tmp_path


def _record(temp_dir, address=ADDRESS):
    """What ``ray start`` leaves in Ray's temp folder ``temp_dir`` (``<temp>/ray_current_cluster``)."""
    from ray._common.utils import get_ray_address_file

    record = get_ray_address_file(str(temp_dir))
    temp_dir.mkdir(parents=True, exist_ok=True)
    with open(record, "w") as f:
        f.write(address)


@pytest.mark.parametrize("address, joins", [(None, False), ("local", False), (ADDRESS, True)])
def test_joins_ray_cluster_follows_rays_rule(address, joins, ray_tmp):
    assert joins_ray_cluster(address) is joins


def test_auto_joins_a_ray_running_on_this_machine(ray_tmp, monkeypatch):
    import ray._private.services as services

    monkeypatch.setattr(services, "find_gcs_addresses", lambda: [ADDRESS])  # a Ray started without `ray start`
    assert joins_ray_cluster("auto")
    assert not joins_ray_cluster(None)  # unset: only a recorded cluster is joined


def test_auto_with_no_cluster_to_find_is_refused_naming_the_cause(ray_tmp):
    with pytest.raises(ConfigError, match=r"ray_kwargs\.ray_init\.address=auto: Ray found no cluster to join "
                                          r"\(ConnectionError: Could not find any running Ray instance"):
        joins_ray_cluster("auto")
    rc, _, err = _dry_run("+ray_kwargs.ray_init.address=auto")
    assert rc == 1 and "Ray found no cluster to join" in err and "joining the Ray cluster" not in err


def test_a_cluster_recorded_by_ray_start_is_joined_without_an_address(ray_tmp):
    """Ray's rule for ``address`` unset: the cluster the last ``ray start`` (or ``ray.cluster_utils.Cluster``) on this
    machine recorded in its temp folder."""
    _record(ray_tmp / "ray")
    assert joins_ray_cluster(None) and joins_ray_cluster("auto")
    rc, doc, err = _dry_run()
    assert rc == 0, err[-3000:]
    _accepted_by_ray_when_joining(_ray_init(doc))
    assert "the cluster the last `ray start` on this machine recorded" in err


def test_the_temp_dir_of_ray_init_is_where_the_record_is_looked_up(ray_tmp):
    custom = ray_tmp / "elsewhere"
    _record(custom)
    assert not joins_ray_cluster(None) and joins_ray_cluster(None, str(custom))
    rc, doc, err = _dry_run(f"+ray_kwargs.ray_init._temp_dir={custom}")
    assert rc == 0, err[-3000:]
    _accepted_by_ray_when_joining(_ray_init(doc))
    assert f"recorded in ray_kwargs.ray_init._temp_dir={custom}" in err
    rc, doc, err = _dry_run()  # the default temp folder has no record: a cluster of its own
    assert rc == 0 and _ray_init(doc)["num_cpus"] == 16 and "joining the Ray cluster" not in err


# ---- a joined cluster's nodes against the resource pools verl will ask for ---------------------------------------
def _nodes(*per_node):
    return {f"node{i}": {"CPU": cpus, "GPU": gpus} for i, (cpus, gpus) in enumerate(per_node)}


def _pools_config(*overrides):
    from verl_ext.dry_run import compose_run_config

    return compose_run_config("toy_cpu", list(overrides))


def test_verls_cpus_per_bundle():
    import dataclasses

    from verl.single_controller.ray.base import ResourcePoolManager

    from verl_ext.resource_pools import VERL_CPUS_PER_BUNDLE

    default = {f.name: f.default for f in dataclasses.fields(ResourcePoolManager)}["max_colocate_count"]
    assert default == VERL_CPUS_PER_BUNDLE


def test_nodes_with_too_few_cpus_for_verls_bundles_are_refused_naming_each_node_and_the_need():
    from verl_ext.resource_pools import check_pools_fit

    config = _pools_config("trainer.nnodes=2", "trainer.n_gpus_per_node=1")
    with pytest.raises(ConfigError) as refused:
        check_pools_fit(config, _nodes((2, 1), (2, 1)), "ray_kwargs.ray_init.address=h:1")
    message = str(refused.value)
    assert "node0: 1 GPU, 2 CPU; node1: 1 GPU, 2 CPU" in message
    assert "global_pool: 2 placement group(s) of 1 bundle(s) {'GPU': 1, 'CPU': 3}" in message
    assert "at least 1 GPU and 3 CPU free on it" in message and "trainer.nnodes" in message
    check_pools_fit(config, _nodes((3, 1), (3, 1)), "x")  # exactly a bundle each


def test_gpus_spread_thinner_than_a_node_of_the_pool_are_refused():
    # verl's own check compares the cluster's total of GPUs only (2 >= 2): the run would wait forever
    from verl_ext.resource_pools import check_pools_fit

    config = _pools_config("trainer.nnodes=1", "trainer.n_gpus_per_node=2")
    with pytest.raises(ConfigError, match=r"1 placement group\(s\) of 2 bundle\(s\).*at least 2 GPU and 6 CPU"):
        check_pools_fit(config, _nodes((8, 1), (8, 1)), "x")
    check_pools_fit(config, _nodes((8, 2), (8, 0)), "x")


REWARD_POOL = ["reward.reward_model.enable_resource_pool=true", "reward.reward_model.nnodes=2",
               "reward.reward_model.n_gpus_per_node=3"]


def test_a_layout_that_fits_is_found_where_largest_first_packing_misses_it():
    """Nodes of 6 and 4 GPUs hold a global pool of [4] and a reward pool of [3, 3] as 3 + 3 on the first and 4 on the
    second; first-fit from the largest puts the 4 on the first node and has no room left for a 3."""
    from verl_ext.resource_pools import check_pools_fit, trainer_pools

    config = _pools_config("trainer.nnodes=1", "trainer.n_gpus_per_node=4", "reward.reward_model.enable=true",
                           *REWARD_POOL)
    assert trainer_pools(config) == {"global_pool": [4], "reward_pool": [3, 3]}
    check_pools_fit(config, _nodes((18, 6), (12, 4)), "x")
    with pytest.raises(ConfigError, match="in any layout"):  # 10 GPUs as 5 + 5: enough in all, no layout
        check_pools_fit(config, _nodes((18, 5), (18, 5)), "x")


def test_the_reward_pool_is_counted_only_when_verl_places_it():
    """With ``enable_resource_pool`` but the reward model off, verl creates no placement group for the reward pool
    (its reward loop gets the pool only with the reward model on)."""
    from verl_ext.resource_pools import check_pools_fit, trainer_pools

    config = _pools_config("trainer.nnodes=1", "trainer.n_gpus_per_node=4", "reward.reward_model.enable=false",
                           *REWARD_POOL)
    assert trainer_pools(config) == {"global_pool": [4]}
    check_pools_fit(config, _nodes((12, 4)), "x")


def _brute_force_fits(groups, nodes, cpus_per_bundle=3):
    import itertools

    for where in itertools.product(range(len(nodes)), repeat=len(groups)):
        used = [[0, 0] for _ in nodes]
        for g, node in zip(groups, where):
            used[node][0] += g
            used[node][1] += g * cpus_per_bundle
        if all(u[0] <= n[1] and u[1] <= n[0] for u, n in zip(used, nodes)):
            return True
    return False


def test_the_layout_search_is_exact():
    """Against every assignment of groups to nodes, on random small clusters and pools."""
    import random

    from verl_ext.resource_pools import pools_fit

    rng = random.Random(6)
    seen = set()
    for _ in range(400):
        nodes = [(rng.choice((6, 9, 12, 24)), rng.randint(0, 8)) for _ in range(rng.randint(1, 3))]
        groups = [rng.randint(1, 5) for _ in range(rng.randint(1, 5))]
        expected = _brute_force_fits(groups, nodes)
        seen.add(expected)
        assert pools_fit({"a": groups}, _nodes(*nodes)) is expected, (groups, nodes)
    assert seen == {True, False}


def test_a_search_too_large_to_finish_warns_and_does_not_refuse(monkeypatch):
    from verl_ext import resource_pools

    config = _pools_config("trainer.nnodes=1", "trainer.n_gpus_per_node=4", "reward.reward_model.enable=true",
                           *REWARD_POOL)
    nodes = _nodes((18, 5), (18, 5))  # no layout (above): decided after a few placements
    assert resource_pools.pools_fit(resource_pools.trainer_pools(config), nodes) is False
    assert resource_pools.pools_fit(resource_pools.trainer_pools(config), nodes, max_steps=1) is None
    monkeypatch.setattr(resource_pools, "SEARCH_STEPS", 1)
    with pytest.warns(UserWarning, match="could not decide whether the Ray cluster"):
        resource_pools.check_pools_fit(config, nodes, "x")
