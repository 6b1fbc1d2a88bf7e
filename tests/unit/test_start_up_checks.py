"""verl_ext's start-up checks (verl_ext/run_checks.py ``STARTUP_CHECKS``): with every verl_ext feature off, a run that
verl accepts is never refused; batch sizes verl's engine cannot split are refused at start-up, naming the keys and a
value that works (which verl's own checks then accept)."""

from __future__ import annotations

import pytest

from verl_ext.config import ConfigError
from verl_ext.dry_run import compose_run_config
from verl_ext.run_checks import STARTUP_CHECKS, check_gec_group_wait, validate_run_config

# the toy with every verl_ext feature off: verl's grpo, verl's single-turn agent loop, no GEC
PLAIN = ["algorithm.adv_estimator=grpo", "algorithm.gec.enable=false",
         "actor_rollout_ref.rollout.agent.default_agent_loop=single_turn_agent"]
ACTOR = "actor_rollout_ref.actor"


def _prepared(*overrides: str):
    """The toy's config with ``overrides``, through everything ``python -m verl_ext.main`` checks before Ray starts
    (verl_ext's start-up checks, then verl's ``validate_config``); raises what a run would."""
    from verl_ext.main import prepare

    config = compose_run_config("toy_cpu", list(overrides))
    prepare(config, [])
    return config


# verl settings that verl runs, each with a verl_ext feature that some start-up check refuses it with
VERL_SETTINGS = {
    "dr_grpo_horizon_on_v1": (["trainer.use_v1=true", f"{ACTOR}.loss_agg_mode=seq-mean-token-sum-norm",
                               "algorithm.norm_adv_by_std_in_grpo=false"], "algorithm.adv_estimator=edge_grpo"),
    "filter_groups_on_legacy": (["trainer.use_v1=false", "algorithm.filter_groups.enable=true"],
                                "algorithm.adv_estimator=gepo"),
    "rollout_is": (["actor_rollout_ref.rollout.calculate_log_probs=true",
                    "algorithm.rollout_correction.rollout_is=token"], "algorithm.gec.enable=true"),
    "bypass_mode": (["actor_rollout_ref.rollout.calculate_log_probs=true",
                     "algorithm.rollout_correction.bypass_mode=true"], "algorithm.adv_estimator=edge_grpo"),
    "remax": (["algorithm.adv_estimator=remax"], "algorithm.gec.enable=true"),
    "router_replay": (["actor_rollout_ref.rollout.enable_rollout_routing_replay=true"], "algorithm.gec.enable=true"),
    "group_of_one": (["actor_rollout_ref.rollout.n=1", f"{ACTOR}.ppo_micro_batch_size_per_gpu=16",
                      "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=16"], "algorithm.adv_estimator=gepo"),
}


@pytest.mark.parametrize("name", VERL_SETTINGS)
def test_a_plain_verl_run_is_never_refused_by_verl_ext(name):
    settings, feature = VERL_SETTINGS[name]
    config = _prepared(*PLAIN, *settings)  # verl_ext's checks and verl's own accept it
    ext = validate_run_config(config)
    for check in STARTUP_CHECKS:  # each check on its own, as the walk of validate_run_config
        check(config, ext)
    # the same settings with a verl_ext feature on are refused: the checks above had something to refuse
    with pytest.raises(ConfigError):
        _prepared(*PLAIN, *settings, feature, "actor_rollout_ref.rollout.agent.default_agent_loop=gec_agent")


def test_start_up_checks_are_one_ordered_list_that_validate_run_config_walks(monkeypatch):
    import verl_ext.run_checks as run_checks

    assert check_gec_group_wait in STARTUP_CHECKS and STARTUP_CHECKS[-1] is run_checks.check_engine_batch_split
    called = []
    monkeypatch.setattr(run_checks, "STARTUP_CHECKS", tuple(
        (lambda c, e, name=check.__name__: called.append(name)) for check in STARTUP_CHECKS))
    validate_run_config(compose_run_config("toy_cpu", []))
    assert called == [check.__name__ for check in STARTUP_CHECKS]


ONE_PROMPT = ["data.train_batch_size=1", f"{ACTOR}.ppo_mini_batch_size=1"]  # toy: rollout.n=8, micro-batches of 64


@pytest.mark.parametrize("features", [PLAIN, []], ids=["plain_grpo", "toy_edge_grpo_gec"])
def test_a_batch_the_engine_cannot_split_is_refused_naming_the_keys_and_a_size_that_works(features):
    with pytest.raises(ConfigError) as refused:
        _prepared(*features, *ONE_PROMPT)
    message = str(refused.value)
    assert (f"{ACTOR}.ppo_micro_batch_size_per_gpu=64 against 8 responses per rank in each actor mini-batch "
            f"({ACTOR}.ppo_mini_batch_size=1 x n=8 / 1 ranks): set {ACTOR}.ppo_micro_batch_size_per_gpu=8") in message
    assert ("actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=64 against 8 responses per rank in each "
            "old-log-prob pass (data.train_batch_size=1 x n=8 / 1 ranks): set "
            "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8") in message
    assert f"{ACTOR}.use_dynamic_bsz=true" in message
    # the sizes it names pass (the toy's run with them: docs/combinations.md), as does dynamic batch size
    _prepared(*features, *ONE_PROMPT, f"{ACTOR}.ppo_micro_batch_size_per_gpu=8",
              "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8")
    _prepared(*features, *ONE_PROMPT, f"{ACTOR}.use_dynamic_bsz=true")


def test_the_reference_pass_is_checked_when_a_reference_runs():
    sizes = [*PLAIN, *ONE_PROMPT, f"{ACTOR}.ppo_micro_batch_size_per_gpu=8",
             "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8",
             "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=16"]
    _prepared(*sizes)  # no KL: no reference pass
    with pytest.raises(ConfigError, match=r"ref\.log_prob_micro_batch_size_per_gpu=16 against 8 responses per rank "
                                          r"in each reference pass .*set actor_rollout_ref\.ref\."
                                          r"log_prob_micro_batch_size_per_gpu=8"):
        _prepared(*sizes, f"{ACTOR}.use_kl_loss=true")


def test_a_mini_batch_the_ranks_cannot_share_is_refused():
    # 2 ranks, rollout.n=3: verl's own check (train_batch_size x n a multiple of the GPUs) passes, the mini-batch of 3
    # responses cannot be shared by 2 ranks
    sizes = [*PLAIN, "trainer.n_gpus_per_node=2", "actor_rollout_ref.rollout.n=3", "data.train_batch_size=4"]
    with pytest.raises(ConfigError, match=rf"{ACTOR}\.ppo_mini_batch_size=1 with actor_rollout_ref\.rollout\.n=3 on 2 "
                                          rf"data-parallel ranks.*a multiple of 2 \(e\.g\. 2,"):
        _prepared(*sizes, f"{ACTOR}.ppo_mini_batch_size=1")
    _prepared(*sizes, f"{ACTOR}.ppo_mini_batch_size=2", f"{ACTOR}.ppo_micro_batch_size_per_gpu=3",
              "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=6")


def test_the_legacy_trainer_needs_whole_mini_batches_and_v1_pads_to_them():
    sizes = [*PLAIN, "data.train_batch_size=3", f"{ACTOR}.ppo_mini_batch_size=2", f"{ACTOR}.ppo_micro_batch_size_per_gpu=16",
             "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=16"]
    with pytest.raises(ConfigError, match=rf"data\.train_batch_size=3 with {ACTOR}\.ppo_mini_batch_size=2 on the "
                                          rf"legacy trainer.*set {ACTOR}\.ppo_mini_batch_size=1"):
        _prepared(*sizes, "trainer.use_v1=false")
    _prepared(*sizes, "trainer.use_v1=true")  # 24 responses padded to 32: two micro-batches of 16 per pass
