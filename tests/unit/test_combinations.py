"""Start-up refusals of verl feature combinations that would silently misbehave with verl_ext's features."""

import os
import re

import pytest
from hydra import compose, initialize_config_dir

from verl_ext.config import ConfigError, register_structured_configs
from verl_ext.run_checks import validate_run_config

CONFIG_DIR = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "hydra_configs"))


def validate(*overrides):
    register_structured_configs()
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        validate_run_config(compose(config_name="verl_ext", overrides=list(overrides)))


GEC = "algorithm.gec.enable=true"
MASKED = "algorithm.gec.mask_injected=true"


@pytest.mark.parametrize("feature", ["algorithm.adv_estimator=edge_grpo", "algorithm.adv_estimator=gepo", GEC])
def test_filter_groups_on_the_legacy_trainer_is_refused(feature):
    with pytest.raises(ConfigError, match=r"algorithm\.filter_groups\.enable=true with trainer\.use_v1=false .*"
                                          r"legacy trainer ignores filter_groups"):
        validate(feature, "algorithm.filter_groups.enable=true", "trainer.use_v1=false")
    validate(feature, "algorithm.filter_groups.enable=true", "trainer.use_v1=true")  # the v1 replay buffer filters


def test_filter_groups_without_verl_ext_features_is_verls_business():
    validate("algorithm.adv_estimator=grpo", "algorithm.filter_groups.enable=true", "trainer.use_v1=false")


@pytest.mark.parametrize("setting, shown", [
    ("algorithm.rollout_correction.rollout_is=token", "algorithm.rollout_correction.rollout_is='token'"),
    ("algorithm.rollout_correction.rollout_rs=seq_mean_k1", "algorithm.rollout_correction.rollout_rs='seq_mean_k1'"),
    ("algorithm.rollout_correction.bypass_mode=true", "algorithm.rollout_correction.bypass_mode=true"),
    ("algorithm.gepo.logprob_source=rollout", "algorithm.gepo.logprob_source=rollout"),
])
def test_gec_with_readers_of_rollout_log_probs_is_refused_unless_injected_tokens_are_masked(setting, shown):
    settings = ["algorithm.adv_estimator=gepo",  # token_mean needs no entropy: bypass_mode reaches the GEC check
                "actor_rollout_ref.rollout.calculate_log_probs=true", setting]
    with pytest.raises(ConfigError, match=rf"algorithm\.gec\.enable=true cannot be combined with {re.escape(shown)}: "
                                          r".*rollout log-prob is 0\.0.*algorithm\.gec\.mask_injected=true"):
        validate(*settings, GEC)
    validate(*settings, GEC, MASKED)  # the injected tokens leave the response mask: nothing reads their 0.0
    validate(*settings, "algorithm.gec.enable=false")


def test_the_supported_combinations_pass():
    validate("algorithm.adv_estimator=gepo", GEC, "algorithm.gepo.base=rloo", "algorithm.norm_adv_by_std_in_grpo=false",
             "actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-sum-norm",
             "actor_rollout_ref.actor.loss_scale_factor=512",  # v1: a constant horizon must be set (run_checks)
             "actor_rollout_ref.actor.use_kl_loss=true", "actor_rollout_ref.actor.ppo_epochs=2", "trainer.use_v1=true",
             "trainer.v1.trainer_mode=separate_async", "algorithm.filter_groups.enable=true",
             "algorithm.gepo.ema_init=warmup_pool", "algorithm.gepo.warmup_steps=3",
             "algorithm.gepo.threshold_source=window")


BYPASS = ["algorithm.rollout_correction.bypass_mode=true", "actor_rollout_ref.rollout.calculate_log_probs=true",
          "algorithm.gec.enable=false"]


@pytest.mark.parametrize("settings", [
    ["algorithm.adv_estimator=gepo"],  # token_mean: H_g from old_log_probs, which bypass mode sets to the rollout's
    ["algorithm.adv_estimator=gepo", "algorithm.gepo.entropy_estimator=sum_mean", "algorithm.gepo.base=rloo"],
    ["algorithm.adv_estimator=gepo", "algorithm.gepo.entropy_estimator=resp_mean_of_means",
     "algorithm.gepo.base=drgrpo"],
    ["algorithm.adv_estimator=gepo", "algorithm.gepo.logprob_source=rollout"],
])
def test_bypass_mode_with_estimators_that_need_no_entropy_passes(settings):
    """tests/e2e/test_combinations.py::test_v1_gepo_in_rollout_correction_bypass_mode runs the first one on v1."""
    validate(*settings, *BYPASS)


@pytest.mark.parametrize("settings, named", [
    (["algorithm.adv_estimator=edge_grpo"], "algorithm.adv_estimator=edge_grpo"),
    (["algorithm.adv_estimator=gepo", "algorithm.gepo.base=edge_grpo"],
     "gepo with base=edge_grpo and entropy_estimator=token_mean"),
    (["algorithm.adv_estimator=gepo", "algorithm.gepo.entropy_estimator=full_entropy"],
     "gepo with base=grpo and entropy_estimator=full_entropy"),
])
def test_bypass_mode_with_estimators_that_read_the_entropy_is_refused(settings, named):
    with pytest.raises(ConfigError, match=rf"{re.escape(named)} needs the per-token entropy of the old-log-prob pass, "
                                          r"which algorithm\.rollout_correction\.bypass_mode=true skips"):
        validate(*settings, *BYPASS)
