"""A real two-node Ray cluster on one machine (``ray.cluster_utils.Cluster``: a head and a second raylet, each with its
own logical CPUs and one logical GPU), joined by address as a user joins a cluster (docs/multi-node.md):
``python -m verl_ext.main trainer.nnodes=2 trainer.n_gpus_per_node=1 +ray_kwargs.ray_init.address=<head>``.

One cluster for the module, one run of 2 steps and its resume to step 3, many claims each: FSDP's two ranks on
different nodes (one gloo process group across them), an agent-loop worker on each node, GEC with
``edit_scope=all_wrong_groups``, GEPO's history on the TaskRunner checkpointed and restored, the file logger.
The cluster lives in its own temporary folder (``RAY_TMPDIR``) on random ports, so a plain ``ray.init()`` elsewhere
on the machine never finds it, and its shutdown ends its own processes only.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import tempfile

import pytest

from tests.e2e.conftest import assert_shaped_training
from verl_ext.rollout.gec import EDIT_BRANCHES
from verl_ext.trainer.history_checkpoint import STATE_FILE

pytestmark = pytest.mark.e2e

N = 8  # rollout.n of SMALL_RUN


@pytest.fixture(scope="module")
def two_node_cluster():
    """A head and a worker node, 8 logical CPUs and 1 logical GPU each (verl's bundles ask for GPU slots; torch never
    sees CUDA). Yields the cluster; its address is ``cluster.address``."""
    from ray.cluster_utils import Cluster

    # short: Ray's socket paths (<temp>/ray/session_<date>_<pid>/sockets/...) must stay under 107 characters
    temp = tempfile.mkdtemp(prefix="ray2n-", dir="/tmp")
    previous = os.environ.get("RAY_TMPDIR")
    os.environ["RAY_TMPDIR"] = temp  # the cluster's files, and Ray's "latest cluster" record, stay in here
    # the nodes' processes inherit this environment: without VERL_PLATFORM, as on a cluster's nodes, so CPU mode
    # reaches the job's workers only through the job's runtime_env (verl_ext.main.select_platform)
    platform = os.environ.pop("VERL_PLATFORM", None)
    cluster = None
    try:
        cluster = Cluster(initialize_head=True, head_node_args=dict(
            num_cpus=8, num_gpus=1, include_dashboard=False,
            _system_config={"prestart_worker_first_driver": False}))
        cluster.add_node(num_cpus=8, num_gpus=1)
        cluster.wait_for_nodes()
        if platform is not None:
            os.environ["VERL_PLATFORM"] = platform
        yield cluster
    finally:
        if platform is not None:
            os.environ["VERL_PLATFORM"] = platform
        if cluster is not None:
            cluster.shutdown()
        if previous is None:
            os.environ.pop("RAY_TMPDIR", None)
        else:
            os.environ["RAY_TMPDIR"] = previous
        shutil.rmtree(temp, ignore_errors=True)


def _new_actors(cluster, seen: set[str]) -> dict[str, str]:
    """{actor name: node id} of the named actors the cluster started since ``seen`` (updated)."""
    placed = {}
    for actor_id, actor in cluster.global_state.actor_table(None).items():
        if actor_id in seen:
            continue
        seen.add(actor_id)
        if actor.get("Name"):
            placed[actor["Name"]] = actor["Address"]["NodeID"]
    return placed


def _assert_spread(placed: dict[str, str], node_ids: set[str]) -> None:
    """FSDP's two ranks (verl's ``<prefix>WorkerDict_<node>:<rank>``, one worker group), their rollout servers
    (``hf_server_<replica>_<rank>``) and the two agent-loop workers each on a different node of the two."""
    ranks = {name: node for name, node in placed.items() if "WorkerDict_" in name}
    assert len(ranks) == 2 and len({name.split("WorkerDict_")[0] for name in ranks}) == 1, placed
    assert set(ranks.values()) == node_ids, placed
    servers = {name: node for name, node in placed.items() if name.startswith("hf_server_")}
    assert len(servers) == 2 and set(servers.values()) == node_ids, placed
    agent_workers = {name: node for name, node in placed.items() if name.startswith("agent_loop_worker_")}
    assert len(agent_workers) == 2 and set(agent_workers.values()) == node_ids, placed


def _assert_all_wrong_groups_scope(rollouts, step: int, values: dict) -> None:
    """GEC edited responses of exactly the groups whose first attempts were all wrong, read per group from verl's
    rollout dump (``gec_group``: the group's uid; ``gec_correct_before``: the first attempt's verdict): a group with a
    right first attempt is untouched, and each edit of the step is one the metrics count."""
    lines = [json.loads(x) for x in (rollouts / f"{step}.jsonl").read_text().splitlines()]
    groups: dict[str, list[dict]] = {}
    for line in lines:
        groups.setdefault(line["gec_group"], []).append(line)
    assert sorted(len(g) for g in groups.values()) == [N] * 4, step
    edited_groups = 0
    for uid, group in groups.items():
        all_wrong = not any(line["gec_correct_before"] for line in group)
        edited = [line for line in group if line["gec_branch"] in EDIT_BRANCHES]
        if not all_wrong:
            assert not edited, (step, uid, [(x["gec_correct_before"], x["gec_branch"]) for x in group])
        edited_groups += bool(edited)
    assert values["gec/groups_all_wrong_before"] == sum(
        not any(line["gec_correct_before"] for line in g) for g in groups.values()), step
    edits = sum(values.get(f"gec/count/{branch}", 0) for branch in EDIT_BRANCHES)
    assert edits == sum(line["gec_branch"] in EDIT_BRANCHES for line in lines), (step, values)
    assert values["gec/responses"] == 32 and values["gec/acc_after"] >= values["gec/acc_before"]


def test_two_nodes_fsdp_agent_workers_gec_gepo_checkpoint_and_resume(two_node_cluster, run_main, tmp_path):
    cluster = two_node_cluster
    node_ids = {node["NodeID"] for node in cluster.global_state.node_table() if node["Alive"]}
    assert len(node_ids) == 2
    seen: set[str] = set(cluster.global_state.actor_table(None))
    # the legacy trainer, as before the toy's default moved to v1 (several nodes on v1: read, not run,
    # docs/combinations.md)
    settings = ["trainer.use_v1=false", "trainer.nnodes=2", "trainer.n_gpus_per_node=1",
                f"+ray_kwargs.ray_init.address={cluster.address}",
                "actor_rollout_ref.rollout.agent.num_workers=2", "algorithm.adv_estimator=gepo",
                "algorithm.gepo.base=edge_grpo", "algorithm.gec.edit_scope=all_wrong_groups", "trainer.save_freq=2",
                f"trainer.rollout_data_dir={tmp_path / 'rollouts'}"]  # written by the TaskRunner, wherever its cwd

    run = run_main(*settings)
    assert "joining the Ray cluster" in run.output and f"Connecting to existing Ray cluster at address: " \
        f"{cluster.address}" in run.output  # joined, not a local Ray of its own
    _assert_spread(_new_actors(cluster, seen), node_ids)
    steps = run.metrics()  # the file logger's metrics.jsonl, written by the TaskRunner
    assert_shaped_training(steps, [1, 2])
    for step, values in steps.items():
        _assert_all_wrong_groups_scope(tmp_path / "rollouts", step, values)
        assert values["gepo/history_updates"] == step  # one update per trained batch
    saved = json.loads((tmp_path / "ckpt" / "global_step_2" / STATE_FILE).read_text())["entropy_history"]
    assert saved["scopes"]["global"]["num_updates"] == 2 and len(saved["scopes"]["global"]["window"]) == 2

    resumed = run_main(*settings, "trainer.total_training_steps=3")
    _assert_spread(_new_actors(cluster, seen), node_ids)  # the resumed run's own ranks and workers
    assert sorted(resumed.metrics()) == [3]  # continues at step 3
    restored = [line for line in resumed.lines if "[verl_ext] restored entropy history" in line]
    assert restored and json.loads(restored[0].split(": ", 1)[1]) == saved  # exactly step 2's history
    values = resumed.metrics()[3]
    assert values["gepo/history_updates"] == 3 and math.isfinite(values["actor/pg_loss"])
    _assert_all_wrong_groups_scope(tmp_path / "rollouts", 3, values)
    after = json.loads((tmp_path / "ckpt" / "global_step_3" / STATE_FILE).read_text())["entropy_history"]
    assert after["scopes"]["global"]["window"][:2] == saved["scopes"]["global"]["window"]  # appended, not re-seeded


def test_pools_the_nodes_cannot_hold_are_refused_before_verl_waits(two_node_cluster, tmp_path):
    """Two GPUs asked of one node, on nodes of one GPU each: the cluster's total (2) passes verl's own check and verl
    would wait for the placement group forever; verl_ext stops before verl's TaskRunner starts, naming each node."""
    cluster = two_node_cluster
    env = {k: v for k, v in os.environ.items() if k != "VERL_PLATFORM"}
    proc = subprocess.run(
        [sys.executable, "-m", "verl_ext.main", "trainer.nnodes=1", "trainer.n_gpus_per_node=2",
         "data.train_batch_size=4", "actor_rollout_ref.actor.ppo_mini_batch_size=4",
         "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
         "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8",
         f"+ray_kwargs.ray_init.address={cluster.address}"],
        cwd=tmp_path, env=dict(env, PYTHONUNBUFFERED="1"), capture_output=True, text=True, timeout=180)
    assert proc.returncode != 0
    err = proc.stderr
    assert "cannot hold the resource pools this run asks verl for" in err, err[-3000:]
    assert err.count(": 1 GPU, 8 CPU") == 2 and "1 placement group(s) of 2 bundle(s) {'GPU': 1, 'CPU': 3}" in err
    assert "TaskRunner" not in proc.stdout + err  # stopped before verl started its driver actor
