"""Whether a running Ray cluster's nodes can hold the resource pools a run asks verl for, checked before verl builds
them (``python -m verl_ext.main`` on a cluster it joins, docs/multi-node.md).

verl 0.9.1 builds each trainer pool (``ResourcePoolManager.create_resource_pool``) as one placement group per entry
of its spec, ``[n_gpus_per_node] * nnodes``, each ``STRICT_PACK`` (all on one node) with one bundle per GPU of
``{"CPU": max_colocate_count, "GPU": 1}`` (``RayResourcePool.get_placement_groups``; ``max_colocate_count`` 3). Its
own check (``_check_resource_available``) compares only the cluster's total of GPUs, so a cluster whose GPUs are
spread thinner than a node's worth, or whose nodes have fewer CPUs than the bundles ask for, waits for the placement
groups forever (Ray's autoscaler prints "No available node types can fulfill resource request").
"""

from __future__ import annotations

from typing import Any

from verl_ext.config import ConfigError, config_value

# verl 0.9.1: ResourcePoolManager.max_colocate_count's default, the CPUs of each bundle of a trainer pool
# (tests/unit/test_ray_address.py checks it against the installed verl)
VERL_CPUS_PER_BUNDLE = 3


def trainer_pools(config: Any) -> dict[str, list[int]]:
    """The trainer pools verl 0.9.1's TaskRunners ask for (``init_resource_pool_mgr`` of both trainers), as
    ``{pool: [GPUs of each placement group]}``: the global pool (actor, rollout, reference, critic), a reward-model
    pool when ``reward.reward_model.enable_resource_pool``, a teacher pool with distillation. (``separate_async``'s
    standalone rollout replicas build their own pools later, one per replica; they are not counted here.)"""
    pools = {"global_pool": [int(config_value(config, "trainer.n_gpus_per_node", 1))]
             * int(config_value(config, "trainer.nnodes", 1))}
    if config_value(config, "reward.reward_model.enable_resource_pool", False):
        pools["reward_pool"] = [int(config_value(config, "reward.reward_model.n_gpus_per_node", 0))] * int(
            config_value(config, "reward.reward_model.nnodes", 0))
    if config_value(config, "distillation.enabled", False):
        pools["teacher_pool"] = [int(config_value(config, "distillation.n_gpus_per_node", 0))] * int(
            config_value(config, "distillation.nnodes", 0))
    return pools


def unplaced_groups(pools: dict[str, list[int]], nodes: dict[str, dict[str, float]], *, gpu: str = "GPU",
                    cpus_per_bundle: int = VERL_CPUS_PER_BUNDLE) -> list[tuple[str, int]]:
    """The placement groups (pool, GPUs) that the nodes' total resources (``{node: {"CPU": .., "GPU": ..}}``) cannot
    hold, each group on one node, packed first-fit from the largest; empty when all fit."""
    free = {node: [float(res.get(gpu, 0)), float(res.get("CPU", 0))] for node, res in nodes.items()}
    groups = sorted(((name, g) for name, sizes in pools.items() for g in sizes if g > 0), key=lambda x: -x[1])
    left = []
    for name, g in groups:
        for room in free.values():
            if room[0] >= g and room[1] >= g * cpus_per_bundle:
                room[0] -= g
                room[1] -= g * cpus_per_bundle
                break
        else:
            left.append((name, g))
    return left


def check_pools_fit(config: Any, nodes: dict[str, dict[str, float]], where: str) -> None:
    """Refuse, naming what each node has and what the pools need, a run whose trainer pools the nodes cannot hold."""
    gpu = "NPU" if str(config_value(config, "trainer.device", "")) == "npu" else "GPU"
    pools = trainer_pools(config)
    if not unplaced_groups(pools, nodes, gpu=gpu):
        return
    has = "; ".join(f"{node}: {res.get(gpu, 0):g} {gpu}, {res.get('CPU', 0):g} CPU" for node, res in nodes.items())
    needs = "; ".join(
        f"{name}: {len(sizes)} placement group(s) of {sizes[0]} bundle(s) {{'{gpu}': 1, 'CPU': "
        f"{VERL_CPUS_PER_BUNDLE}}}, each group on one node (at least {sizes[0]} {gpu} and "
        f"{sizes[0] * VERL_CPUS_PER_BUNDLE} CPU free on it)" for name, sizes in pools.items() if sizes)
    keys = "trainer.nnodes x trainer.n_gpus_per_node" + (
        ", reward.reward_model.nnodes x n_gpus_per_node" if "reward_pool" in pools else "") + (
        ", distillation.nnodes x n_gpus_per_node" if "teacher_pool" in pools else "")
    raise ConfigError(
        f"the Ray cluster ({where}) cannot hold the resource pools this run asks verl for, so verl would wait for them "
        f"forever: its nodes have {has}; the run needs {needs} ({keys}); set trainer.nnodes and "
        f"trainer.n_gpus_per_node to what the nodes hold, or start the nodes with more (ray start --num-gpus "
        f"--num-cpus)")


def joined_cluster_nodes(address: str | None, temp_dir: str | None) -> dict[str, dict[str, float]]:
    """The alive nodes of the cluster ``ray.init(address, _temp_dir)`` joins, ``{"<node ip> (<id>)": resources}``
    (their totals, as ``ray start`` gave them); connects as a short-lived driver and disconnects."""
    import ray

    ray.init(address=address, _temp_dir=temp_dir, log_to_driver=False)
    try:
        return {f"{n['NodeManagerAddress']} ({n['NodeID'][:8]})": dict(n["Resources"])
                for n in ray.nodes() if n.get("Alive")}
    finally:
        ray.shutdown()
