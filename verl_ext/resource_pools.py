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

import warnings
from typing import Any

from verl_ext.config import ConfigError, config_value

# verl 0.9.1: ResourcePoolManager.max_colocate_count's default, the CPUs of each bundle of a trainer pool
# (tests/unit/test_ray_address.py checks it against the installed verl)
VERL_CPUS_PER_BUNDLE = 3


def trainer_pools(config: Any) -> dict[str, list[int]]:
    """The placement groups verl 0.9.1's TaskRunners create for the trainer (``init_resource_pool_mgr`` of both
    trainers), as ``{pool: [GPUs of each placement group]}``: the global pool (actor, rollout, reference, critic), the
    reward-model pool with ``reward.reward_model.enable_resource_pool`` and ``reward.reward_model.enable``, a teacher
    pool with distillation. (With ``enable_resource_pool`` but the reward model off, verl puts ``reward_pool`` in its
    spec, whose total of GPUs its ``_check_resource_available`` counts and refuses loudly itself, but creates its
    placement groups only when a pool is handed out: the reward loop gets it only with the reward model on.
    ``separate_async``'s standalone rollout replicas build their own pools later, one per replica; they are not
    counted here.)"""
    pools = {"global_pool": [int(config_value(config, "trainer.n_gpus_per_node", 1))]
             * int(config_value(config, "trainer.nnodes", 1))}
    if config_value(config, "reward.reward_model.enable_resource_pool", False) and config_value(
            config, "reward.reward_model.enable", False):
        pools["reward_pool"] = [int(config_value(config, "reward.reward_model.n_gpus_per_node", 0))] * int(
            config_value(config, "reward.reward_model.nnodes", 0))
    if config_value(config, "distillation.enabled", False):
        pools["teacher_pool"] = [int(config_value(config, "distillation.n_gpus_per_node", 0))] * int(
            config_value(config, "distillation.nnodes", 0))
    return pools


# the most placements pools_fit tries before it gives up (then the run is not refused, only warned about)
SEARCH_STEPS = 200_000


class _SearchTooLarge(Exception):
    pass


def pools_fit(pools: dict[str, list[int]], nodes: dict[str, dict[str, float]], *, gpu: str = "GPU",
              cpus_per_bundle: int = VERL_CPUS_PER_BUNDLE, max_steps: int | None = None) -> bool | None:
    """Whether the nodes' total resources (``{node: {"CPU": .., "GPU": ..}}``) can hold every placement group of
    ``pools``, each group on one node with ``cpus_per_bundle`` CPUs per GPU: an exact search (backtracking over the
    groups, largest first, trying each distinct free capacity once). None when it takes more than ``max_steps``
    placements (default :data:`SEARCH_STEPS`): undecided."""
    groups = sorted((g for sizes in pools.values() for g in sizes if g > 0), reverse=True)
    free = [[float(res.get(gpu, 0)), float(res.get("CPU", 0))] for res in nodes.values()]
    if sum(groups) > sum(room[0] for room in free) or sum(groups) * cpus_per_bundle > sum(room[1] for room in free):
        return False
    budget = [SEARCH_STEPS if max_steps is None else max_steps]

    def place(i: int) -> bool:
        if i == len(groups):
            return True
        need = (groups[i], groups[i] * cpus_per_bundle)
        tried = set()
        for room in free:
            if room[0] < need[0] or room[1] < need[1] or tuple(room) in tried:
                continue
            tried.add(tuple(room))
            budget[0] -= 1
            if budget[0] < 0:
                raise _SearchTooLarge
            room[0] -= need[0]
            room[1] -= need[1]
            placed = place(i + 1)
            room[0] += need[0]
            room[1] += need[1]
            if placed:
                return True
        return False

    try:
        return place(0)
    except _SearchTooLarge:
        return None


def check_pools_fit(config: Any, nodes: dict[str, dict[str, float]], where: str) -> None:
    """Refuse, naming what each node has and what the pools need, a run whose trainer pools the nodes cannot hold in
    any layout; warn (not refuse) where the search for one is too large to finish."""
    gpu = "NPU" if str(config_value(config, "trainer.device", "")) == "npu" else "GPU"
    pools = trainer_pools(config)
    fits = pools_fit(pools, nodes, gpu=gpu)
    if fits:
        return
    has = "; ".join(f"{node}: {res.get(gpu, 0):g} {gpu}, {res.get('CPU', 0):g} CPU" for node, res in nodes.items())
    needs = "; ".join(
        f"{name}: {len(sizes)} placement group(s) of {sizes[0]} bundle(s) {{'{gpu}': 1, 'CPU': "
        f"{VERL_CPUS_PER_BUNDLE}}}, each group on one node (at least {sizes[0]} {gpu} and "
        f"{sizes[0] * VERL_CPUS_PER_BUNDLE} CPU free on it)" for name, sizes in pools.items() if sizes)
    if fits is None:
        warnings.warn(f"verl_ext: could not decide whether the Ray cluster ({where}) can hold this run's resource pools "
                      f"(the search for a layout stopped after {SEARCH_STEPS} placements); if it cannot, verl waits "
                      f"for them forever: its nodes have {has}; the run needs {needs}", stacklevel=2)
        return
    keys = "trainer.nnodes x trainer.n_gpus_per_node" + (
        ", reward.reward_model.nnodes x n_gpus_per_node" if "reward_pool" in pools else "") + (
        ", distillation.nnodes x n_gpus_per_node" if "teacher_pool" in pools else "")
    raise ConfigError(
        f"the Ray cluster ({where}) cannot hold the resource pools this run asks verl for, in any layout, so verl "
        f"would wait for them forever: its nodes have {has}; the run needs {needs} ({keys}); set trainer.nnodes and "
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
